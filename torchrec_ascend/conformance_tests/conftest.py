"""Lets ``pytest --pyargs torchrec_ascend.conformance_tests`` run without ``-p``: loads the suite's plugin here.

Loaded while collecting, the plugin comes too late for its command-line options, so such a run uses the defaults;
``torchrec-ascend conformance`` (or ``-p torchrec_ascend.conformance_tests.pytest_plugin``) passes them.
"""

from __future__ import annotations

from typing import Any

PLUGIN = "torchrec_ascend.conformance_tests.pytest_plugin"


def pytest_configure(config: Any) -> None:
    import importlib

    module = importlib.import_module(PLUGIN)
    if not config.pluginmanager.is_registered(module):
        config.pluginmanager.register(module, PLUGIN)

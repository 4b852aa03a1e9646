"""The plugin manager on test-only distributions (a ``.dist-info`` folder put on ``sys.path``).

Oracle: the distribution metadata written by the test; every error must name the plugin and its distribution.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Callable

import pytest

from torchrec_ascend.errors import PluginError
from torchrec_ascend.hookspecs import hookimpl
from torchrec_ascend.plugin_manager import BLOCK_ENV, PluginManager

_counter = itertools.count()


@pytest.fixture
def install_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], str]:
    """``install_plugin(entry_point_name, module_source)`` makes a distribution providing it; returns the dist name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(entry_point: str, source: str) -> str:
        n = next(_counter)
        dist, module = f"standin-plugin-dist-{n}", f"standin_plugin_module_{n}"
        (tmp_path / f"{module}.py").write_text(source)
        info = tmp_path / f"{dist.replace('-', '_')}-1.2.3.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
        (info / "entry_points.txt").write_text(f"[torchrec_ascend]\n{entry_point} = {module}\n")
        return dist

    return install


GOOD = (
    "from torchrec_ascend.hookspecs import hookimpl\n\n"
    "@hookimpl\ndef torchrec_ascend_device_backends():\n    return []\n"
)


def test_third_party_plugins_load_like_builtins_and_name_their_distribution(
    install_plugin: Callable[[str, str], str],
) -> None:
    dist = install_plugin("good_plugin", GOOD)
    manager = PluginManager()
    manager.load_entry_points()
    infos = {info.name: info for info in manager.plugins()}
    assert "builtin_backends" in infos, "built-ins come through the same entry-point group"
    assert infos["builtin_backends"].distribution == "torchrec-ascend"
    assert (infos["good_plugin"].distribution, infos["good_plugin"].version) == (dist, "1.2.3")


def test_a_plugin_failing_to_import_is_named_with_its_distribution(
    install_plugin: Callable[[str, str], str],
) -> None:
    dist = install_plugin("broken_plugin", "raise ImportError('needs libfoo')\n")
    with pytest.raises(PluginError) as caught:
        PluginManager().load_entry_points()
    message = str(caught.value)
    assert "'broken_plugin'" in message and f"{dist} 1.2.3" in message
    assert "ImportError: needs libfoo" in message
    assert f"{BLOCK_ENV}=broken_plugin" in message


def test_blocked_plugins_are_not_even_imported(install_plugin: Callable[[str, str], str]) -> None:
    install_plugin("broken_plugin", "raise ImportError('needs libfoo')\n")
    manager = PluginManager(blocked=["broken_plugin", "s3fifo"])
    manager.load_entry_points()
    names = [info.name for info in manager.plugins()]
    assert "broken_plugin" not in names and "s3fifo" not in names
    assert "builtin_backends" in names


def test_a_misspelled_hook_is_named_with_its_distribution(install_plugin: Callable[[str, str], str]) -> None:
    dist = install_plugin(
        "typo_plugin",
        "from torchrec_ascend.hookspecs import hookimpl\n\n@hookimpl\ndef torchrec_ascend_device_backend():\n"
        "    return []\n",
    )
    with pytest.raises(PluginError) as caught:
        PluginManager().load_entry_points()
    message = str(caught.value)
    assert "'typo_plugin'" in message and dist in message
    assert "torchrec_ascend_device_backend" in message


class Raising:
    """A plugin whose hook raises."""

    @hookimpl
    def torchrec_ascend_device_backends(self) -> list:
        raise ZeroDivisionError("boom")


def test_a_plugin_raising_in_a_hook_is_named() -> None:
    manager = PluginManager()
    manager.register(Raising(), "raising")
    with pytest.raises(PluginError, match="'raising'.*torchrec_ascend_device_backends.*ZeroDivisionError: boom"):
        manager.collect("torchrec_ascend_device_backends")


def test_revision_counts_registration_changes() -> None:
    manager = PluginManager()
    start = manager.revision
    plugin = type("Empty", (), {})
    manager.register(plugin, "empty")
    manager.unregister("empty")
    assert manager.revision == start + 2

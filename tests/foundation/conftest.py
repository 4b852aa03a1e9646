"""Fixtures for the foundation tests: throw-away patch targets, in-process plugins, a clean backend selection."""

from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, List

import pytest

from patch_targets import TARGET_SOURCE
from torchrec_ascend import backends
from torchrec_ascend.plugin_manager import get_plugin_manager

_counter = itertools.count()


@pytest.fixture(scope="session")
def target_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder on ``sys.path`` for the test-only modules."""
    folder = tmp_path_factory.mktemp("patch_targets")
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


@pytest.fixture
def new_target_module(target_folder: Path) -> Iterator[Callable[[], ModuleType]]:
    """``new_target_module()`` writes a fresh copy of :data:`TARGET_SOURCE` under a new name and imports it."""
    names = []

    def make() -> ModuleType:
        name = f"patch_target_{next(_counter)}"
        (target_folder / f"{name}.py").write_text(TARGET_SOURCE)
        importlib.invalidate_caches()
        names.append(name)
        return importlib.import_module(name)

    yield make
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture
def fresh_backend_selection(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Select the backend again in this test (its env vars set by the test), and restore the process's after.

    The pytest process runs the patched TorchRec, which asks the active backend: it is CPU again afterwards.
    """
    for name in (backends.DEVICE_ENV, backends.FALLBACK_ENV):
        monkeypatch.delenv(name, raising=False)
    backends.reset_for_tests()
    yield
    monkeypatch.undo()
    backends.reset_for_tests()
    backends.activate()


@pytest.fixture
def add_plugin() -> Iterator[Callable[[Any, str], None]]:
    """``add_plugin(plugin, name)`` registers on the process-wide plugin manager; unregistered at teardown."""
    manager = get_plugin_manager()
    names: List[str] = []

    def add(plugin: Any, name: str) -> None:
        manager.register(plugin, name)
        names.append(name)

    yield add
    for name in names:
        manager.unregister(name)

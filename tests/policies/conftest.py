"""Fixtures for policy tests: register plugins in-process (as a test or program may) and remove them afterwards."""

from __future__ import annotations

from typing import Any, Callable, Iterator, List

import pytest

from torchrec_ascend.plugin_manager import get_plugin_manager


@pytest.fixture
def register_plugin() -> Iterator[Callable[[Any, str], None]]:
    """``register_plugin(plugin, name)`` registers on the process-wide manager; unregistered at teardown."""
    manager = get_plugin_manager()
    names: List[str] = []

    def register(plugin: Any, name: str) -> None:
        manager.register(plugin, name)
        names.append(name)

    yield register
    for name in names:
        manager.unregister(name)


@pytest.fixture
def broken_plugin(register_plugin: Callable[[Any, str], None]) -> Any:
    """The deliberately broken policies of ``broken_policies``, registered in-process."""
    import broken_policies

    register_plugin(broken_policies, "broken_policies")
    return broken_policies

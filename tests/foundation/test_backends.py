"""Backend selection in-process, with test-only profiles from an in-process plugin.

Oracle: the profiles' declared priorities and detect results (auto picks the highest present), the override
variable, and the errors' required content (valid names, the underlying import error, the fallback switch).
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, Callable, List

import pytest

from torchrec_ascend import backends
from torchrec_ascend.backends.cpu import CPU
from torchrec_ascend.errors import BackendError
from torchrec_ascend.hookspecs import hookimpl
from torchrec_ascend.plugin_manager import BLOCK_ENV, reset_plugin_manager

PRESENT = dataclasses.replace(CPU, name="present_dev", device_type="present_dev", priority=100, detect=lambda: True)
ABSENT = dataclasses.replace(CPU, name="absent_dev", device_type="absent_dev", priority=200, detect=lambda: False)


class ProfilesPlugin:
    """A plugin providing ``profiles`` and counting how often it is asked."""

    def __init__(self, *profiles: backends.DeviceProfile) -> None:
        self.profiles = list(profiles)
        self.calls = 0

    @hookimpl
    def torchrec_ascend_device_backends(self) -> List[backends.DeviceProfile]:
        self.calls += 1
        return self.profiles


@pytest.fixture
def broken_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module whose import fails as a device stack without its native libraries does."""
    (tmp_path / "broken_stack_standin.py").write_text(
        'raise ImportError("libascend_standin.so: cannot open shared object file")\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "broken_stack_standin"


def test_auto_picks_the_highest_priority_present_backend(
    fresh_backend_selection: None, add_plugin: Callable[[Any, str], None]
) -> None:
    add_plugin(ProfilesPlugin(PRESENT, ABSENT), "test_profiles")
    assert backends.activate() is PRESENT
    assert backends.selection_status().requested == "auto"
    assert backends.selection_status().selected == "present_dev"


def test_override_wins_over_auto(
    fresh_backend_selection: None, add_plugin: Callable[[Any, str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    add_plugin(ProfilesPlugin(PRESENT, ABSENT), "test_profiles")
    monkeypatch.setenv(backends.DEVICE_ENV, " CPU ")
    assert backends.activate().name == "cpu"
    assert backends.active().name == "cpu", "activation happens once"


def test_auto_picks_the_best_builtin_present_here(fresh_backend_selection: None) -> None:
    present = [p for p in backends.profiles().values() if p.detect()]
    assert backends.profiles()["cpu"] in present, "cpu is always present"
    assert backends.activate() is max(present, key=lambda p: p.priority)


def test_unknown_backend_lists_the_valid_names(fresh_backend_selection: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(backends.DEVICE_ENV, "npx")
    with pytest.raises(BackendError) as caught:
        backends.activate()
    message = str(caught.value)
    assert "'npx'" in message and backends.DEVICE_ENV in message
    assert "valid names: auto, cpu, cuda, npu" in message
    assert "Did you mean 'npu'?" in message


def test_broken_stack_raises_with_the_underlying_error(
    fresh_backend_selection: None, add_plugin: Callable[[Any, str], None], broken_module: str
) -> None:
    broken = dataclasses.replace(PRESENT, name="broken_dev", requires_modules=(broken_module,), installed_with="x")
    add_plugin(ProfilesPlugin(broken), "test_profiles")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no silent (or warned) fallback without the switch
        with pytest.raises(BackendError) as caught:
            backends.activate()
    message = str(caught.value)
    assert "'broken_dev'" in message
    assert "ImportError: libascend_standin.so: cannot open shared object file" in message
    assert backends.FALLBACK_ENV in message and f"{backends.DEVICE_ENV}=cpu" in message
    assert isinstance(caught.value.__cause__, ImportError)
    assert "libascend_standin.so" in backends.selection_status().detail


def test_fallback_to_cpu_only_when_asked_and_with_a_warning(
    fresh_backend_selection: None,
    add_plugin: Callable[[Any, str], None],
    broken_module: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = dataclasses.replace(PRESENT, name="broken_dev", requires_modules=(broken_module,))
    add_plugin(ProfilesPlugin(broken), "test_profiles")
    monkeypatch.setenv(backends.FALLBACK_ENV, "1")
    with pytest.warns(RuntimeWarning, match="libascend_standin.so.*Falling back to CPU"):
        profile = backends.activate()
    assert profile.name == "cpu"
    assert backends.selection_status().selected == "cpu"
    assert backends.selection_status().detail.startswith("fell back to cpu")


def test_a_backend_provided_twice_names_both_plugins(
    fresh_backend_selection: None, add_plugin: Callable[[Any, str], None]
) -> None:
    add_plugin(ProfilesPlugin(PRESENT), "first_plugin")
    add_plugin(ProfilesPlugin(PRESENT), "second_plugin")
    with pytest.raises(BackendError, match="'present_dev' is provided twice.*'first_plugin'.*'second_plugin'"):
        backends.profiles()


def test_profiles_are_cached_until_the_plugins_change(
    fresh_backend_selection: None, add_plugin: Callable[[Any, str], None]
) -> None:
    counting = ProfilesPlugin(PRESENT)
    add_plugin(counting, "counting")
    first = backends.profiles()
    assert backends.profile_for("present_dev") is PRESENT
    assert backends.profiles() == first
    assert counting.calls == 1, "the planner hooks ask on every query: collect once"
    add_plugin(ProfilesPlugin(ABSENT), "later")
    assert set(backends.profiles()) == set(first) | {"absent_dev"}
    assert counting.calls == 2


def test_resetting_the_plugin_manager_drops_the_cache(
    fresh_backend_selection: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "cpu" in backends.profiles()
    monkeypatch.setenv(BLOCK_ENV, "builtin_backends")
    reset_plugin_manager()
    try:
        assert backends.profiles() == {}
        assert backends.profile_for("cpu") is None
        with pytest.raises(BackendError, match="no device backend reports its device as present"):
            backends.activate()
    finally:
        monkeypatch.delenv(BLOCK_ENV)
        reset_plugin_manager()
    assert "cpu" in backends.profiles()


def test_profile_for_unknown_device_type_is_none() -> None:
    assert backends.profile_for("mtia") is None
    assert backends.profile_for("cpu") is backends.profiles()["cpu"]

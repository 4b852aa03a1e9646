"""``torchrec-ascend doctor`` in this process (patched by the entry point).

Oracle: the process's own registry, backend selection and plugin list; the report must show each of them, fit
100 columns, and the exit status must follow the problems found.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
from types import ModuleType
from typing import Callable

import pytest

from torchrec_ascend import backends, hooks, versions
from torchrec_ascend.cli import doctor
from torchrec_ascend.injection import autoload
from torchrec_ascend.injection.patch import Patch
from torchrec_ascend.injection.registry import PatchRegistry
from torchrec_ascend.plugin_manager import get_plugin_manager

TORCHREC = importlib.metadata.version("torchrec")
FBGEMM = importlib.metadata.version("fbgemm-gpu-cpu")


@pytest.fixture(scope="module")
def healthy() -> doctor.Diagnosis:
    return doctor.diagnose()


def test_lists_every_patch_with_its_state(healthy: doctor.Diagnosis) -> None:
    registry = autoload.registry()
    assert registry is not None, "these tests run under the entry point: do not set TORCHREC_ASCEND_AUTOLOAD=0"
    lines = healthy.text.splitlines()
    for status in registry.report():
        assert f"  {status.state.value:<8} {status.patch.name}  [requires" in "\n".join(lines), status.patch.name
    assert f"Patches ({len(registry.report())} applied):" in healthy.text


def test_shows_versions_backend_requirements_and_plugins(healthy: doctor.Diagnosis) -> None:
    text = healthy.text
    assert f"torchrec          {TORCHREC}" in text
    assert f"Device backend: {backends.active().name} (requested: auto)" in text
    assert "Autoload: active" in text
    fbgemm_range, torchrec_range = map(re.escape, (versions.TORCHREC_FBGEMM["fbgemm-gpu|fbgemm-gpu-cpu"],
                                                   versions.TORCHREC["torchrec"]))
    assert re.search(rf"fbgemm-gpu\|fbgemm-gpu-cpu +{fbgemm_range} +fbgemm-gpu-cpu {re.escape(FBGEMM)} +ok", text)
    assert re.search(rf"torchrec +{torchrec_range} +torchrec {re.escape(TORCHREC)} +ok", text)
    for info in get_plugin_manager().plugins():
        assert info.name in text
    assert text.rstrip().endswith("Errors: none")


def test_fits_100_columns(healthy: doctor.Diagnosis) -> None:
    too_wide = [line for line in healthy.text.splitlines() if len(line) > doctor.WIDTH]
    assert too_wide == []


def test_exit_status_follows_the_problems(
    healthy: doctor.Diagnosis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    assert healthy.problems == []
    assert doctor.run(argparse.Namespace()) == 0
    monkeypatch.setattr(autoload.STATUS, "state", "error")
    monkeypatch.setattr(autoload.STATUS, "detail", "autoload: OSError: simulated")
    assert doctor.run(argparse.Namespace()) == 1
    assert "Errors:\n  autoload: autoload: OSError: simulated" in capsys.readouterr().out


def test_unsupported_versions_show_as_skipped_and_fail(
    new_target_module: Callable[[], ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registry whose patch needs a TorchRec that is not installed: skipped, flagged, exit status 1."""
    module = new_target_module()
    future = Patch.wrap("t.future_torchrec", f"{module.__name__}:f0", {"torchrec": ">=9.0"}, "needs 9.0", lambda f: f)
    registry = PatchRegistry([future])
    with pytest.warns(RuntimeWarning, match=f"torchrec {re.escape(TORCHREC)} is outside the supported range >=9.0"):
        registry.apply()
    monkeypatch.setattr(autoload, "registry", lambda: registry)
    diagnosis = doctor.diagnose()
    assert re.search(rf"torchrec +>=9\.0 +torchrec {re.escape(TORCHREC)} +UNSUPPORTED", diagnosis.text)
    assert "  skipped  t.future_torchrec  [requires torchrec]" in diagnosis.text
    assert diagnosis.problems == [f"1 patches skipped: torchrec {TORCHREC} is outside the supported range >=9.0"]
    assert module.f0() == "f0"


def test_shows_the_matched_stack_and_every_reviewed_digest(healthy: doctor.Diagnosis) -> None:
    """Oracle: the version table's row for the installed TorchRec, and the reviewed data file."""
    row = versions.stack_for(TORCHREC)
    assert row is not None, f"torchrec {TORCHREC} is not in the version table"
    assert (f"Supported stack: torchrec {row.torchrec} (reviewed {row.reviewed}; CI lane {row.lane})\n"
            f"  pairs with torch {row.torch}, fbgemm-gpu(-cpu) {row.fbgemm}, torch-npu {row.torch_npu}") in healthy.text
    registry = autoload.registry()
    registrations = {patch.name for patch in hooks.registrations()}  # on torch's op tables: no TorchRec source
    assert {"h6.host_fallback_ops", "h5.sharded_tensor_device"} <= registrations
    for status in registry.report():
        if status.patch.name in registrations:
            assert "not TorchRec source: nothing to review for drift" in healthy.text
            continue
        digest = registry.reviewed.get(status.patch.name, {}).get(row.reviewed, "(none recorded)")
        assert f"source {digest} = reviewed on torchrec {row.reviewed}" in healthy.text, status.patch.name
    assert "DRIFTED" not in healthy.text


def test_lists_every_adapter_with_its_range_and_target(healthy: doctor.Diagnosis) -> None:
    from torchrec_ascend import adapters

    for adapter in adapters.adapters():
        assert f"  supported   {adapter.name}  [torchrec {versions.TORCHREC['torchrec']}]" in healthy.text
        assert adapter.target.partition(":")[2] in healthy.text
    assert f"Adapters ({len(adapters.adapters())} supported):" in healthy.text

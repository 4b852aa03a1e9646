"""Check: torchrec-ascend is injected cleanly: ``doctor`` finds no problem and the device's backend is selected.

``doctor`` runs in a fresh process with ``TORCHREC_ASCEND_DEVICE`` naming the device's backend (as a user's job
would select it; on the emulated NPU under ``--emulate``): autoloading must be active, every patch applied, every
plugin loaded, the backend activated.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest

from torchrec_ascend.conformance_tests.config import SuiteConfig
from torchrec_ascend.conformance_tests.emulated_run import EMULATED_BACKEND
from torchrec_ascend.conformance_tests.launch import python_command, script_env

PROBE = Path(__file__).parent / "injection" / "doctor_state.py"


@pytest.fixture(scope="module")
def state(suite: SuiteConfig) -> Dict[str, Any]:
    from torchrec_ascend.backends import DEVICE_ENV

    reason = suite.absent_reason()
    if reason:
        pytest.skip(reason)
    env = {**os.environ, DEVICE_ENV: suite.profile.name,
           **script_env(suite.profile.device_type, suite.profile.collective_backend, suite.emulate)}
    proc = subprocess.run(python_command(PROBE, env), env=env, capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"doctor crashed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1])


def test_doctor_finds_no_problem(state: Dict[str, Any]) -> None:
    assert not state["problems"], "\n".join(state["problems"]) + "\n\n" + state["text"]


def test_autoload_is_active(state: Dict[str, Any]) -> None:
    assert state["autoload"] == "active", f"torch's entry point left torchrec-ascend {state['autoload']!r}"


def test_device_backend_is_selected(state: Dict[str, Any], suite: SuiteConfig) -> None:
    wanted = EMULATED_BACKEND if suite.emulate else suite.profile.name
    assert state["selected"] == wanted, f"backend {state['selected']!r} selected, not {wanted!r}"


def test_every_patch_applied(state: Dict[str, Any]) -> None:
    not_applied = [f"{p['name']}: {p['state']} {p['detail']}" for p in state["patches"] if p["state"] != "applied"]
    assert state["patches"] and not not_applied, "\n".join(not_applied) or "no patch registered"

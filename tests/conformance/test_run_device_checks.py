"""scripts/run-device-checks: its arguments and its refusals (it installs and runs nothing before they pass).

The runs themselves need an NVIDIA GPU or an Ascend NPU: they have not run in this repository's CI. Oracle: the exit
statuses and messages the script's usage states, and that a refused run created no venv.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "run-device-checks"


def run(args: List[str], tmp_path: Path) -> Tuple[int, str]:
    proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("args, phrase", [
    ([], "the first argument is the device, cuda or npu"),
    (["rocm"], "(got 'rocm')"),
    (["cuda", "--time-limit", "soon"], "--time-limit takes whole seconds, got 'soon'"),
    (["npu", "--world-size", "two"], "--world-size takes a number, got 'two'"),
    (["cuda", "--emulate"], "unknown argument '--emulate'"),
])
def test_bad_arguments_exit_2_with_the_rule(args: List[str], phrase: str, tmp_path: Path) -> None:
    status, output = run(args, tmp_path)
    assert status == 2, output
    assert phrase in output and "Usage: scripts/run-device-checks cuda|npu" in output, output


@pytest.mark.parametrize("device, tool, hint", [("cuda", "nvidia-smi", "--device cpu"),
                                               ("npu", "npu-smi", "--device npu --emulate")])
def test_absent_device_is_refused_before_installing(device: str, tool: str, hint: str, tmp_path: Path) -> None:
    if shutil.which(tool):
        pytest.skip(f"{tool} is here: the script would install and run")
    status, output = run([device, "--quick"], tmp_path)
    assert status == 3, output
    assert f"no {device} device here" in output and hint in output, output
    assert not (ROOT / ".stacks" / f"device-{device}").exists(), "a refused run must not have installed anything"


def test_help_lists_the_steps(tmp_path: Path) -> None:
    status, output = run(["--help"], tmp_path)
    assert status == 0
    assert "test_stock_matrix.py" in output and "torchrec-ascend conformance --device DEVICE" in output

"""Patch h2.dense_pooled_device: TorchRec's pooled dense (data_parallel) kernel on the NPU.

Oracle: the same stock kernel built for the CPU (same weights): outputs and weight gradients equal, and every
parameter, per-table view and state_dict entry on the device (the stock kernel kept them on the host whenever CUDA
is absent, and DDP over the device's process group then failed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

import pytest

from fresh_interpreter import run_python

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def facts() -> Dict[str, Any]:
    paths = os.pathsep.join([str(HERE.parent / "foundation"), str(HERE)])
    return run_python("from emulator_probe import main; main('dense_kernels')", env={"PYTHONPATH": paths}, timeout=300)


@pytest.mark.parametrize("kind", ["pooled"])
def test_dense_kernel_lives_on_the_device(facts: Dict[str, Any], kind: str) -> None:
    kernel = facts[kind]
    assert kernel["parameters"] == kernel["per_table"] == kernel["state_dict"] == ["npu:0"]
    assert kernel["cpu_kernel"] == "cpu"  # a kernel built for the CPU stays there


@pytest.mark.parametrize("kind", ["pooled"])
def test_dense_kernel_matches_the_cpu_kernel(facts: Dict[str, Any], kind: str) -> None:
    assert facts[kind]["output"] == ["npu:0", True]
    assert facts[kind]["grad"] == ["npu:0", True]

"""Patches h2.dense_pooled_device / h2.dense_sequence_device: the dense (data_parallel) kernels on the NPU.

Pooled: TorchRec's kernel; sequence: the npu profile's ``sequence/dense`` kernel (SequenceDenseEmbedding, over the
stock sequence kernel's constructor). Oracle: the same kernel built for the CPU (same weights): outputs and weight
gradients equal, and every parameter, per-table view and state_dict entry on the device (the stock kernels kept them
on the host whenever CUDA is absent, and DDP over the device's process group then failed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

from fresh_interpreter import run_python
from torchrec_ascend.conformance_tests.stock.case_loop import devices_of

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def facts() -> Dict[str, Any]:
    paths = os.pathsep.join([str(HERE.parent / "foundation"), str(HERE)])
    return run_python("from emulator_probe import main; main('dense_kernels')", env={"PYTHONPATH": paths}, timeout=300)


@pytest.mark.parametrize("kind", ["pooled", "sequence"])
def test_dense_kernel_lives_on_the_device(facts: Dict[str, Any], kind: str) -> None:
    kernel = facts[kind]
    assert kernel["parameters"] == kernel["per_table"] == kernel["state_dict"] == ["npu:0"]
    assert kernel["cpu_kernel"] == "cpu"  # a kernel built for the CPU stays there


@pytest.mark.parametrize("kind", ["pooled", "sequence"])
def test_dense_kernel_matches_the_cpu_kernel(facts: Dict[str, Any], kind: str) -> None:
    assert facts[kind]["output"] == ["npu:0", True]
    assert facts[kind]["grad"] == ["npu:0", True]


def test_residency_ignores_torchs_host_step_counter() -> None:
    """A data_parallel table's dense Adagrad keeps its state with the table but its ``step`` on the host (torch's
    non-fused optimizers always do); the conformance residency report counts the state only ("meta" stands in for
    the device here: no emulator in this process)."""
    weight = torch.nn.Parameter(torch.zeros(3, 2, device="meta"))
    optimizer = torch.optim.Adagrad([weight])
    weight.grad = torch.ones(3, 2, device="meta")
    optimizer.step()
    assert {k: v.device.type for k, v in optimizer.state[weight].items()} == {"step": "cpu", "sum": "meta"}
    assert devices_of(optimizer) == {"meta"}


def test_npu_profiles_replace_the_sequence_dense_kernel() -> None:
    """fbgemm's dense TBE pools despite PoolingMode.NONE off CUDA: the npu profiles use the CPU's replacement."""
    from torchrec_ascend.backends.cpu import CPU
    from torchrec_ascend.backends.npu import NPU
    from torchrec_ascend.testing.backend import EMULATED_NPU

    expected = CPU.kernel_overrides["sequence/dense"]
    assert NPU.kernel_overrides["sequence/dense"] == EMULATED_NPU.kernel_overrides["sequence/dense"] == expected

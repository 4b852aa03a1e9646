"""Patch h5.sharded_tensor_device: ``ShardedTensor.device`` on a rank that holds no shard, on the emulated NPU.

Oracle: torch's own ``tensor_device`` op (which calls torch.cuda for a non-gloo group and so fails on a build without
CUDA), the local shard's device on the rank holding it, and ``cpu`` on a gloo group (torch's answer, unchanged).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

from fresh_interpreter import run_python
from torchrec_ascend import hooks
from torchrec_ascend.hooks.sharded_tensor_device import sharded_tensor_device_patch

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ranks() -> Dict[str, Any]:
    paths = os.pathsep.join([str(HERE.parent / "foundation"), str(HERE)])
    facts = run_python("from emulator_probe import main; main('sharded_tensor_device')", env={"PYTHONPATH": paths},
                       timeout=300)
    assert facts["exit"] == [0, 0]
    return facts["ranks"]


def test_a_rank_without_shards_answers_its_current_npu(ranks: Dict[str, Any]) -> None:
    # torch's own op reaches torch.cuda: a CPU-only build says it has no CUDA, a CUDA build without a GPU no driver
    cuda_failures = ("Torch not compiled with CUDA", "Found no NVIDIA driver")
    assert any(text in ranks["1"]["torch_op"] for text in cuda_failures), "torch's op fails there: the patch is needed"
    assert ranks["1"]["device"] == "npu:1"


def test_other_cases_keep_torchs_answer(ranks: Dict[str, Any]) -> None:
    assert ranks["0"]["device"] == "npu:0" and ranks["0"]["torch_op"] == ""  # the local shard's device
    assert ranks["0"]["gloo_device"] == ranks["1"]["gloo_device"] == "cpu"


def test_is_a_named_reversible_registry_entry() -> None:
    from torch.distributed._shard.sharded_tensor import _SHARDED_OPS

    patch = sharded_tensor_device_patch()
    assert patch.name in [p.name for p in hooks.registrations()] and "torch" in patch.requires
    key = torch.Tensor.device.__get__
    before = _SHARDED_OPS[key]
    undo = patch.apply()
    assert _SHARDED_OPS[key] is not before
    undo()
    assert _SHARDED_OPS[key] is before

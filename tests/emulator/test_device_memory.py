"""The emulated NPU's device memory capacity (``install(memory=...)``) and allocator statistics.

Oracle: torch_npu's behaviour: an allocation past the device's memory raises ``torch.OutOfMemoryError`` ("NPU out
of memory. Tried to allocate ..."), and ``memory_allocated`` / ``max_memory_allocated`` /
``reset_peak_memory_stats`` / ``mem_get_info`` count the bytes of live tensors (no caching allocator here).
"""

from __future__ import annotations

import textwrap
from typing import Any, Dict

import pytest

from fresh_interpreter import run_python

PROGRAM = """
import torch
from fresh_interpreter import report
from torchrec_ascend.testing import emulated_npu
emulated_npu.install(memory=1 << 20)                     # 1 MiB per device
npu = torch.npu
facts = {"capacity": emulated_npu.memory_capacity()}
a = torch.empty(1 << 18, dtype=torch.uint8, device="npu")   # 256 KiB
b = torch.empty(1 << 19, dtype=torch.uint8, device="npu")   # 512 KiB
facts["allocated"] = npu.memory_allocated()
facts["free_total"] = list(npu.mem_get_info())
try:
    torch.empty(1 << 19, dtype=torch.uint8, device="npu")    # 512 KiB more: past the capacity
    facts["oom"] = ""
except torch.OutOfMemoryError as err:
    facts["oom"] = str(err)
facts["allocated_after_oom"] = npu.memory_allocated()
del b
facts["after_free"] = npu.memory_allocated()
facts["peak"] = npu.max_memory_allocated()
npu.reset_peak_memory_stats()
facts["peak_after_reset"] = npu.max_memory_allocated()
c = torch.empty(1 << 19, dtype=torch.uint8, device="npu")   # fits again once b is gone
facts["refit"] = npu.memory_allocated()
report(facts)
"""


@pytest.fixture(scope="module")
def facts() -> Dict[str, Any]:
    return run_python(textwrap.dedent(PROGRAM))


def test_an_allocation_past_the_capacity_fails_as_torch_npus_does(facts: Dict[str, Any]) -> None:
    assert facts["capacity"] == 1 << 20
    assert facts["oom"].startswith("NPU out of memory. Tried to allocate 512.00 KiB (NPU 0; 1.00 MiB total capacity; "
                                   "768.00 KiB already allocated; 256.00 KiB free)"), facts["oom"]
    assert "install(memory=...)" in facts["oom"], "the error should say where the capacity comes from"
    assert facts["allocated_after_oom"] == facts["allocated"] == 3 << 18  # the failed allocation holds nothing


def test_statistics_count_live_tensors_and_the_peak(facts: Dict[str, Any]) -> None:
    assert facts["free_total"] == [(1 << 20) - (3 << 18), 1 << 20]
    assert facts["after_free"] == 1 << 18
    assert facts["peak"] == 3 << 18 and facts["peak_after_reset"] == 1 << 18
    assert facts["refit"] == 3 << 18

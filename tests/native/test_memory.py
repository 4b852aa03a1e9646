"""huge_page_full against torch.full (the oracle): same values, shape, dtype and layout, whatever the size; plain_empty
against np.empty: same shape, dtype and layout, and memory without the huge-page advice numpy gives large arrays."""

from __future__ import annotations

import gc
import sys
from typing import List

import numpy as np
import pytest
import torch

from torchrec_ascend.native.memory import HUGE_PAGE, huge_page_full, plain_empty


@pytest.mark.parametrize(
    "shape, value, dtype",
    [
        ((0, 2), -1, torch.int64),  # empty: nothing to advise
        ((16, 2), -1, torch.int64),  # smaller than one huge page
        ((3 * HUGE_PAGE // 16 + 5, 2), -1, torch.int64),  # spans whole huge pages and ragged ends
        ((HUGE_PAGE + 3,), 7, torch.int32),
    ],
)
def test_equals_torch_full(shape, value, dtype) -> None:
    out = huge_page_full(shape, value, dtype)
    expected = torch.full(shape, value, dtype=dtype)
    assert out.dtype == dtype and out.shape == expected.shape and out.is_contiguous() and out.device.type == "cpu"
    assert torch.equal(out, expected)


@pytest.mark.parametrize(
    "shape, dtype",
    [((0,), np.int64), ((0, 36), np.uint64), ((5,), np.int8), ((3, 7), np.float32), ((1 << 20, 4), np.uint64)],
)
def test_plain_empty_is_like_np_empty(shape, dtype) -> None:
    out = plain_empty(shape, dtype)
    expected = np.empty(shape, dtype)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert out.flags.c_contiguous and out.flags.writeable
    out[...] = 3
    gc.collect()  # the array alone keeps its memory: nothing it was made from is referenced elsewhere
    assert (out == 3).all()


def vm_flags(address: int) -> List[str]:
    """The VmFlags of the mapping holding ``address`` (``hg``: advised huge pages)."""
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):  # a mapping's first line: start-end perms ...
                start, end = (int(bound, 16) for bound in first.split("-"))
                inside = start <= address < end
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping holds address {address:#x}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge-page advice is Linux's")
def test_plain_empty_memory_is_not_advised_huge_pages() -> None:
    size = (1 << 20, 4)  # 32 MiB: numpy advises huge pages for arrays of 4 MiB and more
    advised, plain = np.empty(size, np.uint64), plain_empty(size, np.uint64)
    middle = advised.nbytes // 2  # numpy advises the whole pages inside the array, so look inside
    if "hg" not in vm_flags(advised.ctypes.data + middle):
        pytest.skip("numpy gives no huge-page advice here (NUMPY_MADVISE_HUGEPAGE=0 or an old kernel)")
    assert "hg" not in vm_flags(plain.ctypes.data + middle)

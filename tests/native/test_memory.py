"""huge_page_full against torch.full (the oracle): same values, shape, dtype and layout, whatever the size."""

from __future__ import annotations

import pytest
import torch

from torchrec_ascend.native.memory import HUGE_PAGE, huge_page_full


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

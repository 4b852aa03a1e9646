"""``place_vbe_output``: a kernel's variable-batch output placed into TorchRec's shared one, at the offsets TorchRec
gives it, without reading the offsets on the host.

Oracle: a plain-Python placement, element by element, from the documented layout (TorchRec's
``_create_vbe_output_and_offsets``: offsets ``[rank][feature]``; the kernel's output per rank, per feature,
``samples x dim`` flattened).
"""

from __future__ import annotations

from typing import List, Tuple

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.kernels.fused import place_vbe_output


def python_placement(own: List[float], samples: List[List[int]], dims: List[int], size: int,
                     offsets: List[List[int]]) -> List[float]:
    out = [0.0] * size
    read = 0
    for rank in range(len(offsets)):
        for feature, dim in enumerate(dims):
            for i in range(samples[feature][rank] * dim):
                out[offsets[rank][feature] + i] = own[read]
                read += 1
    return out


Layout = Tuple[List[List[int]], List[int], List[List[int]], int]  # samples[feature][rank], dims, offsets, size


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    world = draw(st.integers(1, 3))
    dims = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    samples = [[draw(st.integers(0, 3)) for _ in range(world)] for _ in dims]
    gap = draw(st.integers(0, 3))  # other kernels' blocks sit between ours
    offsets: List[List[int]] = []
    at = gap
    for rank in range(world):
        row: List[int] = []
        for feature, dim in enumerate(dims):
            row.append(at)
            at += samples[feature][rank] * dim
        offsets.append(row)
        at += gap
    return samples, dims, offsets, at


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_blocks_land_at_their_offsets(layout: Layout) -> None:
    samples, dims, offsets, size = layout
    total = sum(samples[f][r] * d for f, d in enumerate(dims) for r in range(len(offsets)))
    own = torch.arange(1, total + 1, dtype=torch.float32)
    placed = place_vbe_output(own, samples, dims, torch.zeros(size), torch.tensor(offsets))
    assert placed.tolist() == python_placement(own.tolist(), samples, dims, size, offsets)


def test_gradients_reach_the_kernel_output() -> None:
    own = torch.ones(4, requires_grad=True)
    placed = place_vbe_output(own, [[1, 1]], [2], torch.zeros(6), torch.tensor([[0], [4]]))
    (placed * torch.arange(6.0)).sum().backward()
    assert own.grad is not None and own.grad.tolist() == [0.0, 1.0, 4.0, 5.0]

"""RowChunks against one flat tensor: gather/scatter across chunk boundaries, rows unmoved by growth."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.kernels.key_value.row_chunks import RowChunks


@settings(deadline=None, max_examples=30)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.data())
def test_matches_a_flat_tensor(growth_steps, data):
    chunks, flat, capacity, written = RowChunks(width=3, dtype=torch.float32), torch.empty(0, 3), 0, set()
    for step in growth_steps:
        capacity += step
        chunks.grow(capacity)
        flat = torch.cat([flat, torch.empty(step, 3)])
        slots = torch.tensor(data.draw(st.lists(st.integers(0, capacity - 1), unique=True)), dtype=torch.int64)
        rows = torch.randn(slots.numel(), 3)
        chunks.scatter(slots, rows)
        flat[slots] = rows
        written |= set(slots.tolist())
        everything = torch.tensor(sorted(written), dtype=torch.int64)
        assert torch.equal(chunks.gather(everything), flat[everything])  # earlier rows did not move
    assert chunks.capacity == capacity
    assert chunks.nbytes == capacity * 3 * 4


def test_growth_keeps_rows_in_place():
    chunks = RowChunks(width=2, dtype=torch.float64)
    chunks.grow(2)
    chunks.scatter(torch.tensor([0, 1]), torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64))
    chunks.grow(5)
    chunks.grow(3)  # no-op: already addressable
    chunks.scatter(torch.tensor([4]), torch.tensor([[5.0, 6.0]], dtype=torch.float64))
    assert chunks.gather(torch.tensor([4, 1, 0])).tolist() == [[5.0, 6.0], [3.0, 4.0], [1.0, 2.0]]

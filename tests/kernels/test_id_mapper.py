"""The ID mapper's prefetch and pins, against a plain-Python model of the batches in flight.

Oracle: a pipeline prefetches batch k+1 before batch k's lookup (depth 2). After each lookup, a pool row is pinned
once per batch in flight that uses it: the batch just looked up (its backward is still to come) and every batch
prefetched but not yet looked up. A lookup returns exactly the rows its prefetch mapped (a row never moves while
pinned), and every lookup found its rows ready.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.hash.configs import HashTableSpec
from torchrec_ascend.hash.slot_table import SlotTable
from torchrec_ascend.kernels.id_mapper import IdMapper
from torchrec_ascend.kernels.row_tier import PoolOnly

ROWS = 64  # plenty for two batches in flight: every prefetch fits


class _RowlessPool:
    """A pool without rows: the pins are the slot table's, no row is written."""

    names = ["t"]

    def initialise(self, t: int, assignment: object) -> None:
        pass

    def write_default_row(self, t: int) -> None:
        pass


def _mapper() -> Tuple[IdMapper, SlotTable]:
    table = SlotTable("t", HashTableSpec(), ROWS, "evict")
    pool: Any = _RowlessPool()
    return IdMapper([table], ["f"], [0], pool, PoolOnly(pool), training=lambda: True), table


def _pins_expected(batches: List[torch.Tensor], slots: int) -> torch.Tensor:
    pins = torch.zeros(slots, dtype=torch.int64)
    for slots in batches:
        pins[torch.unique(slots)] += 1
    return pins


batches_of_ids = st.lists(st.lists(st.integers(0, 20), min_size=1, max_size=6), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(batches_of_ids)
def test_prefetched_rows_are_pinned_exactly_while_their_batch_is_in_flight(batches: List[List[int]]) -> None:
    mapper, table = _mapper()
    features = [KeyedJaggedTensor(keys=["f"], values=torch.tensor(b), lengths=torch.tensor([len(b)])) for b in batches]
    mapped: List[torch.Tensor] = []

    def prefetch(k: int) -> None:
        mapper.prefetch(features[k].values(), features[k].offsets())
        mapped.append(table.id_map.lookup(features[k].values()))

    prefetch(0)
    for k in range(len(batches)):
        if k + 1 < len(batches):
            prefetch(k + 1)
        rows = mapper.lookup(features[k]).values()
        assert torch.equal(rows, mapped[k])
        in_flight = mapped[k:k + 2]
        assert torch.equal(table.pins.long(), _pins_expected(in_flight, table.pins.numel()))
    assert mapper.prefetched_batches == len(batches)


def test_without_prefetch_nothing_is_pinned() -> None:
    mapper, table = _mapper()
    kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([3, 4, 3]), lengths=torch.tensor([3]))
    rows = mapper.lookup(kjt).values()
    assert torch.equal(rows, table.id_map.lookup(torch.tensor([3, 4, 3])))
    assert int(table.pins.abs().sum()) == 0 and mapper.prefetched_batches == 0

"""SlotTable checkpoint support: an exact restore continues like the table that never stopped (eviction and admission
decisions included); a restore without state re-inserts the IDs; the change tracking of incremental saves reports
exactly the IDs used or gone since the mark. Oracles: the original table, a set model of the assignments."""

from __future__ import annotations

from typing import List, Set

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.errors import CapacityError
from torchrec_ascend.hash.configs import HashTableSpec
from torchrec_ascend.hash.slot_table import SlotTable

ROWS = 17  # 16 IDs and the reserved row
SPEC = HashTableSpec(overflow="evict", eviction_policy="lfu", admission_policy="count",
                     admission_options=(("threshold", 2),))
BATCHES = st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=10), min_size=2, max_size=12)


def table() -> SlotTable:
    return SlotTable("t", SPEC, ROWS, "evict")


def ids_of(batch: List[int]) -> torch.Tensor:
    return torch.tensor(batch, dtype=torch.int64)


def clone(state: dict) -> dict:
    return {k: ({n: t.clone() for n, t in v.items()} if isinstance(v, dict) and k in ("eviction", "admission")
                else v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}


@settings(deadline=None, max_examples=30)
@given(BATCHES, st.data())
def test_exact_restore_continues_like_the_original(batches: List[List[int]], data: st.DataObject) -> None:
    split = data.draw(st.integers(1, len(batches) - 1))
    original = table()
    for batch in batches[:split]:
        original.assign(ids_of(batch), training=True)
    restored = table()
    restored.restore(*original.held(), clone(original.checkpoint_state()))
    for batch in batches[split:]:
        a = original.assign(ids_of(batch), training=True)
        b = restored.assign(ids_of(batch), training=True)
        for field in ("slots", "new_slots", "new_ids", "evicted_slots", "evicted_ids"):
            assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert original.stats() == restored.stats()


def test_restore_without_state_reinserts_the_ids() -> None:
    restored = table()
    ids = torch.arange(100, 116)
    restored.restore(ids, torch.arange(15, -1, -1), torch.zeros(16, dtype=torch.int64), {"step": 3})
    held_ids, held_slots, _ = restored.held()
    assert sorted(held_ids.tolist()) == ids.tolist() and restored.step == 3
    a = restored.assign(torch.tensor([1, 1, 2, 2]), training=True)  # admitted (count 2), full: evicts restored IDs
    assert a.evicted_ids.numel() == 2 and set(a.evicted_ids.tolist()) <= set(ids.tolist())
    with pytest.raises(CapacityError):
        restored.restore(torch.arange(17), torch.arange(17), torch.zeros(17, dtype=torch.int64))


@settings(deadline=None, max_examples=30)
@given(BATCHES, st.data())
def test_changes_since_mark_are_what_changed(batches: List[List[int]], data: st.DataObject) -> None:
    split = data.draw(st.integers(1, len(batches) - 1))
    t = table()
    for batch in batches[:split]:
        t.assign(ids_of(batch), training=True)
    held_at_mark: Set[int] = set(t.held()[0].tolist())
    t.mark_checkpoint("token")
    used: Set[int] = set()
    inserted: Set[int] = set()
    for batch in batches[split:]:
        inserted |= set(t.assign(ids_of(batch), training=True).new_ids.tolist())
        used |= set(batch)
    slots, left = t.changes_since_mark()
    held_now = set(t.held()[0].tolist())
    assert set(t.slot_ids[slots].tolist()) == used & held_now
    assert set(left.tolist()) == (held_at_mark | inserted) - held_now
    assert t.checkpoint_mark == "token"

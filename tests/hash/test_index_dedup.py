"""Index dedup before the all-to-all: each table's distinct IDs once, reverse indices that rebuild every value, and
no merging of raw IDs across tables. Oracle: a plain-Python set per table."""

from __future__ import annotations

from typing import List, Tuple

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.sharders.index_dedup import dedup_per_table, table_groups

BATCH = 3
FEATURES_PER_TABLE = st.lists(st.integers(1, 3), min_size=1, max_size=3)


def batch(features_per_table: List[int], data: st.DataObject) -> Tuple[KeyedJaggedTensor, List[Tuple[int, int]]]:
    keys = [f"t{t}_f{f}" for t, n in enumerate(features_per_table) for f in range(n)]
    bags = data.draw(st.lists(st.lists(st.sampled_from([0, 5, 64, 69, 2**62, 2**63 - 1]), max_size=4),
                              min_size=len(keys) * BATCH, max_size=len(keys) * BATCH))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.tensor([i for b in bags for i in b], dtype=torch.int64),
        lengths=torch.tensor([len(b) for b in bags]),
    )
    starts = [sum(features_per_table[:t]) for t in range(len(features_per_table) + 1)]
    return kjt, list(zip(starts, starts[1:]))


@settings(deadline=None, max_examples=80)
@given(FEATURES_PER_TABLE, st.data())
def test_each_table_sends_its_distinct_ids_once(features_per_table: List[int], data: st.DataObject) -> None:
    kjt, groups = batch(features_per_table, data)
    deduped, reverse = dedup_per_table(kjt, groups)
    assert deduped.keys() == kjt.keys() and deduped.lengths().numel() == kjt.lengths().numel()
    assert torch.equal(deduped.values()[reverse], kjt.values())  # every value is rebuilt
    for first, end in groups:
        sent = torch.cat([deduped[k].values() for k in kjt.keys()[first:end]]).tolist()
        wanted = {i for k in kjt.keys()[first:end] for i in kjt[k].values().tolist()}
        assert sorted(sent) == sorted(wanted)  # distinct, none lost, none from another table


def test_raw_ids_of_two_tables_never_merge() -> None:
    # Linearized by table size (64 rows), user ID 69 and item ID 5 would be one index.
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["user", "item"], values=torch.tensor([69, 69, 5, 5, 2**63 - 1]), lengths=torch.tensor([2, 0, 1, 2])
    )
    deduped, reverse = dedup_per_table(kjt, table_groups(torch.tensor([0, 1, 2])))
    assert deduped.values().tolist() == [69, 5, 2**63 - 1]
    assert reverse.tolist() == [0, 0, 1, 1, 2]
    assert deduped.lengths().tolist() == [1, 0, 1, 1]


def test_features_of_one_table_share_their_ids() -> None:
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b", "c"], values=torch.tensor([7, 8, 7, 9]), lengths=torch.tensor([2, 1, 1])
    )
    assert table_groups(torch.tensor([0, 2, 2, 3])) == [(0, 2), (2, 3)]
    deduped, reverse = dedup_per_table(kjt, [(0, 2), (2, 3)])
    assert deduped.values().tolist() == [7, 8, 9] and reverse.tolist() == [0, 1, 0, 2]


def test_weights_accumulate_per_distinct_id_when_asked() -> None:
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a"], values=torch.tensor([3, 4, 3]), lengths=torch.tensor([3]), weights=torch.tensor([1.0, 2.0, 0.5])
    )
    assert dedup_per_table(kjt, [(0, 1)])[0].weights_or_none() is None
    assert dedup_per_table(kjt, [(0, 1)], accumulate_weights=True)[0].weights().tolist() == [1.5, 2.0]

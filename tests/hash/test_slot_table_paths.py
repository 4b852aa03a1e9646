"""SlotTable's one-pass insert (training, no policies, no lower tier) behaves like its general path: same rows per
ID, same counters, and the same all-or-nothing capacity error. Oracle: the general path, forced by a lower tier
that holds nothing."""

from __future__ import annotations

from typing import List

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.errors import CapacityError
from torchrec_ascend.hash.configs import HashTableSpec
from torchrec_ascend.hash.slot_table import SlotTable

ROWS = 9  # 8 IDs and the reserved row
BATCHES = st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=8), min_size=1, max_size=10)


def nothing_below(ids: torch.Tensor) -> torch.Tensor:
    return torch.zeros(ids.shape, dtype=torch.bool)


@settings(deadline=None, max_examples=60)
@given(BATCHES)
def test_one_pass_insert_matches_the_general_path(batches: List[List[int]]) -> None:
    fast, general = SlotTable("t", HashTableSpec(), ROWS, "error"), SlotTable("t", HashTableSpec(), ROWS, "error")
    refused = False  # the general path stamps the hits of a refused batch, the one-pass insert stamps nothing
    for batch in batches:
        ids = torch.tensor(batch, dtype=torch.int64)
        outcomes = []
        for table, known in ((fast, None), (general, nothing_below)):
            try:
                slots = table.assign(ids, training=True, known=known).slots
                assert torch.equal(table.slot_ids[slots], ids)  # every occurrence reads its own ID's row
                outcomes.append("ok")
            except CapacityError as err:
                outcomes.append(str(err))
        assert outcomes[0] == outcomes[1]
        assert fast.counters == general.counters
        refused = refused or outcomes[0] != "ok"
        assert refused or torch.equal(fast.last_used, general.last_used)
        assert sorted(fast.id_map.export()[0].tolist()) == sorted(general.id_map.export()[0].tolist())


def test_a_batch_that_overflows_leaves_the_table_unchanged() -> None:
    table = SlotTable("user", HashTableSpec(), ROWS, "error")
    table.assign(torch.arange(6), training=True)
    with pytest.raises(CapacityError, match="'user'.*brings 4 new ones \\(2 rows free\\)"):
        table.assign(torch.tensor([0, 10, 11, 12, 13, 10]), training=True)
    assert sorted(table.id_map.export()[0].tolist()) == list(range(6))
    assert int((table.slot_ids >= 0).sum()) == 6

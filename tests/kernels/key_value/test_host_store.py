"""HostStore: budget, LRU spill, promotion, failures leaving the store unchanged, counters."""

import errno
import os

import pytest
import torch

from torchrec_ascend.errors import ConfigError, StorageError
from torchrec_ascend.kernels.key_value.disk_store import DiskStore
from torchrec_ascend.kernels.key_value.host_store import HostStore
from torchrec_ascend.kernels.key_value.row_store import RowStore

WIDTH = 4
BUDGET = 2000  # a handful of rows of width 4 next to the index's fixed cost


def rows_for(keys: torch.Tensor, version: int = 0) -> torch.Tensor:
    """A distinct, recognisable row per key and version."""
    return keys.to(torch.float32)[:, None] * 10 + torch.arange(WIDTH, dtype=torch.float32) + version * 1000


@pytest.fixture
def tiered(tmp_path):
    disk = DiskStore(str(tmp_path), WIDTH, name="user_id", segment_bytes=4096)
    with HostStore(WIDTH, budget_bytes=BUDGET, spill=disk, name="user_id", spill_headroom=0.0, initial_rows=2) as s:
        yield s


def test_budget_holds_while_growing(tiered):
    assert tiered.max_rows > 4
    for start in range(0, 3 * tiered.max_rows, 3):
        tiered.put(torch.arange(start, start + 3), rows_for(torch.arange(start, start + 3)))
        assert tiered.nbytes <= BUDGET
        assert tiered.host_rows <= tiered.max_rows
    stats = tiered.stats()
    assert stats["host_bytes"] == tiered.nbytes and stats["host_rows"] == tiered.max_rows
    assert stats["host_rows"] + stats["disk_rows"] == len(tiered) == 3 * tiered.max_rows
    got, found = tiered.get(torch.arange(3 * tiered.max_rows))
    assert found.all() and torch.equal(got, rows_for(torch.arange(3 * tiered.max_rows)))


def test_spills_the_least_recently_used_rows(tiered):
    full = tiered.max_rows
    keys = torch.arange(full)
    tiered.put(keys, rows_for(keys))
    tiered.get(keys[2:])  # keys 0 and 1 are now the least recently used
    tiered.put(torch.tensor([100, 101]), rows_for(torch.tensor([100, 101])))
    on_disk = tiered.spill.get(torch.arange(full))[1]
    assert on_disk.nonzero().flatten().tolist() == [0, 1]
    assert tiered.stats()["spilled_rows"] == 2 and tiered.stats()["spills"] == 1


def test_get_promotes_disk_rows_and_each_key_lives_in_one_tier(tiered):
    full = tiered.max_rows
    keys = torch.arange(full + 3)
    tiered.put(keys, rows_for(keys))  # more new rows than fit: the last 3 go straight to disk
    assert tiered.stats()["direct_disk_rows"] == 3 and len(tiered.spill) == 3
    got, found = tiered.get(torch.tensor([full + 1, full + 1, 0]))
    assert found.all() and torch.equal(got, rows_for(torch.tensor([full + 1, full + 1, 0])))
    assert not tiered.spill.get(torch.tensor([full + 1]))[1].any()  # promoted: gone from disk
    stats = tiered.stats()
    assert stats["promoted_rows"] == 1 and stats["host_rows"] + stats["disk_rows"] == full + 3


def test_no_promotion_leaves_disk_rows_where_they_are(tmp_path):
    disk = DiskStore(str(tmp_path), WIDTH, name="t")
    with HostStore(WIDTH, budget_bytes=0, spill=disk, name="t", promote=False) as store:
        store.put(torch.tensor([1, 2]), rows_for(torch.tensor([1, 2])))
        assert store.host_rows == 0 and len(disk) == 2
        assert torch.equal(store.get(torch.tensor([2]))[0], rows_for(torch.tensor([2])))
        assert len(disk) == 2 and store.stats()["promoted_rows"] == 0


def test_overwrite_of_a_disk_row_moves_it_up_and_drops_the_old_copy(tiered):
    full = tiered.max_rows
    tiered.put(torch.arange(full + 1), rows_for(torch.arange(full + 1)))  # key `full` on disk
    tiered.put(torch.tensor([full]), rows_for(torch.tensor([full]), version=1))
    got, found = tiered.get(torch.tensor([full]))
    assert found.all() and torch.equal(got, rows_for(torch.tensor([full]), version=1))
    assert len(tiered) == full + 1


def test_pop_takes_rows_from_both_tiers(tiered):
    full = tiered.max_rows
    tiered.put(torch.arange(full + 2), rows_for(torch.arange(full + 2)))
    keys = torch.tensor([0, full + 1, 0, 999])
    got, found = tiered.pop(keys)
    assert found.tolist() == [True, True, True, False]
    assert torch.equal(got[:3], rows_for(keys[:3])) and not got[3].any()
    assert not tiered.get(keys)[1].any() and len(tiered) == full


def test_remove_covers_both_tiers(tiered):
    full = tiered.max_rows
    tiered.put(torch.arange(full + 2), rows_for(torch.arange(full + 2)))
    tiered.remove(torch.tensor([1, full + 1, 1, 12345]))
    assert len(tiered) == full and not tiered.get(torch.tensor([1, full + 1]))[1].any()


def test_over_budget_without_disk_says_which_table_and_how_to_fix():
    store = HostStore(WIDTH, budget_bytes=BUDGET, name="item_id")
    keys = torch.arange(store.max_rows)
    store.put(keys, rows_for(keys))
    with pytest.raises(StorageError, match=r"item_id.*budget_bytes=2000.*at least \d+ bytes.*disk directory"):
        store.put(torch.tensor([0, 500]), rows_for(torch.tensor([0, 500]), version=1))
    got, found = store.get(torch.arange(store.max_rows + 1))  # the failed put changed nothing, not even key 0
    assert found[:-1].all() and not found[-1] and torch.equal(got[:-1], rows_for(keys))
    store.put(keys[:2], rows_for(keys[:2], version=2))  # overwrites fit
    assert torch.equal(store.get(keys[:2])[0], rows_for(keys[:2], version=2))


def test_full_disk_during_spill_changes_nothing(tiered, monkeypatch):
    full = tiered.max_rows
    tiered.put(torch.arange(full), rows_for(torch.arange(full)))
    before = tiered.stats()
    monkeypatch.setattr(os, "pwrite", lambda *_: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(StorageError, match=r"user_id.*No space left"):
        tiered.put(torch.tensor([0, 100]), rows_for(torch.tensor([0, 100]), version=1))
    monkeypatch.undo()
    assert tiered.stats() == before
    got, found = tiered.get(torch.arange(full + 1))
    assert found[:-1].all() and not found[-1] and torch.equal(got[:-1], rows_for(torch.arange(full)))
    tiered.put(torch.tensor([100]), rows_for(torch.tensor([100])))  # usable once there is room again
    assert len(tiered) == full + 1


def test_chunks_cover_both_tiers(tiered):
    n = tiered.max_rows + 5
    tiered.put(torch.arange(n), rows_for(torch.arange(n)))
    keys, rows = map(torch.cat, zip(*tiered.chunks(rows_per_chunk=3)))
    order = keys.argsort()
    assert torch.equal(keys[order], torch.arange(n)) and torch.equal(rows[order], rows_for(torch.arange(n)))


def test_spill_store_must_match_the_row_format(tmp_path):
    with DiskStore(str(tmp_path), WIDTH + 1, name="t") as disk:
        with pytest.raises(ConfigError, match="width 5.*width 4"):
            HostStore(WIDTH, budget_bytes=BUDGET, spill=disk, name="t")


def test_both_tiers_are_row_stores_and_keep_values_not_graphs(tiered):
    assert isinstance(tiered, RowStore) and isinstance(tiered.spill, RowStore)
    weights = torch.randn(tiered.max_rows + 2, WIDTH, requires_grad=True)
    keys = torch.arange(tiered.max_rows + 2)
    tiered.put(keys, weights)  # some rows go to disk (numpy), some stay in host memory
    got, found = tiered.get(keys)
    assert found.all() and not got.requires_grad and torch.equal(got, weights.detach())


def test_load_fills_host_memory_first_then_the_disk_and_clear_forgets_both(tiered):
    n = tiered.max_rows * 3 + 1
    keys = torch.randperm(10 * n)[:n]
    assert tiered.load(zip(keys.split(4), rows_for(keys).split(4))) == n  # chunks cross the host's capacity
    stats = tiered.stats()
    assert stats["host_rows"] == tiered.max_rows and stats["disk_rows"] == n - tiered.max_rows
    got, found = tiered.get(keys)
    assert found.all() and torch.equal(got, rows_for(keys))
    with pytest.raises(ConfigError, match="user_id.*empty store"):
        tiered.load(iter([(torch.tensor([10 * n]), rows_for(torch.tensor([10 * n])))]))
    tiered.clear()
    assert len(tiered) == 0 and not tiered.contains(keys).any() and not list(tiered.chunks())
    assert tiered.load(iter([(keys[:2], rows_for(keys[:2], version=1))])) == 2  # usable after a clear
    assert torch.equal(tiered.get(keys[:2])[0], rows_for(keys[:2], version=1))


def test_load_beyond_the_budget_without_disk_says_how_to_fix():
    store = HostStore(WIDTH, budget_bytes=BUDGET, name="item_id")
    keys = torch.arange(store.max_rows + 3)
    with pytest.raises(StorageError, match=r"item_id': 3 rows to load do not fit.*budget_bytes=2000.*disk directory"):
        store.load(zip(keys.split(2), rows_for(keys).split(2)))

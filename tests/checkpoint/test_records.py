"""Checkpoint records: a chain of saves read back like dict updates, shard ownership a partition of the IDs, and column
shards joined or cut like slices of the full rows. Oracles: a dict model, the reference hash_rank, slicing."""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from typing import Any, Dict, List

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.checkpoint.files import ArrayFileWriter
from torchrec_ascend.checkpoint.layout import ShardLayout
from torchrec_ascend.checkpoint.records import assemble, select
from torchrec_ascend.checkpoint.shard_files import CheckedChain, read_chain, write_shard
from torchrec_ascend.errors import StorageError
from torchrec_ascend.kernels.fused import ShardRows
from torchrec_ascend.native import reference

IDS = st.lists(st.integers(0, 2**63 - 1), max_size=12, unique=True)
BASE = ShardLayout(table="t", hash_ids=True, dim=8, col0=0, cols=8, bucket=0, buckets=1, row_offset=0, rows=64,
                   capacity=63, key_value=False, optimizer="exact_adagrad", states=("element", "row"), eviction="",
                   admission="")


def records(ids: List[int], width: int, value: float) -> ShardRows:
    n = len(ids)
    rows = torch.arange(n * width, dtype=torch.float32).view(n, width) + value
    t = torch.tensor(ids, dtype=torch.int64)
    return ShardRows(t, torch.arange(n), torch.full((n,), 7), rows)


def as_dict(r: ShardRows) -> Dict[int, List[float]]:
    return {i: row.tolist() for i, row in zip(r.ids.tolist(), r.rows)}


def saved_chain(directory: str, saves: List[tuple]) -> List[tuple]:
    """Write ``(records, removed IDs)`` saves as a chain of checkpoint data files; returns ``(folder, entry)``s."""
    chain = []
    for k, (saved, removed) in enumerate(saves):
        folder = os.path.join(directory, f"save-{k}")
        os.makedirs(folder)
        with ArrayFileWriter(os.path.join(folder, "rank-0.data")) as writer:
            blocks = [select(saved, slice(start, start + 5)) for start in range(0, saved.ids.numel(), 5)]
            entry = write_shard(writer, BASE, blocks, functools.partial(torch.tensor, removed, dtype=torch.int64), {})
            writer.commit()
        chain.append((folder, entry))
    return chain


@settings(deadline=None, max_examples=60)
@given(st.lists(st.tuples(IDS, IDS), min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_a_chain_of_saves_reads_back_as_dict_updates(saves: List[tuple], rng: Any) -> None:
    # Oracle: a dict updated by each save (changed IDs win, removed IDs go). Records without a pool slot (-1)
    # are read again from the files by lower_rows, or handed on as checked by CheckedChain; with the pooled ones,
    # either must be the dict.
    expected: Dict[int, tuple] = {}
    written = []
    for k, (ids, removed) in enumerate(saves):
        removed = [i for i in removed if i not in ids] if k else []  # a save never both changes and drops an ID
        saved = records(ids, BASE.width, 1000.0 * k)
        saved.slots = torch.tensor([rng.choice([-1, s]) for s in range(len(ids))], dtype=torch.int64)
        for i in removed:
            expected.pop(i, None)
        expected.update({i: (s, row) for i, s, row in zip(ids, saved.slots.tolist(), saved.rows.tolist())})
        written.append((saved, removed))
    with tempfile.TemporaryDirectory() as directory:
        chain = saved_chain(directory, written)
        read = read_chain(chain)
        lower = {i: (-1, row) for ids, rows in read.lower_rows() for i, row in zip(ids.tolist(), rows.tolist())}
        pooled = {i: (s, row) for i, s, row in zip(read.pooled.ids.tolist(), read.pooled.slots.tolist(),
                                                   read.pooled.rows.tolist())}
        assert {**pooled, **lower} == expected
        assert len(pooled) + len(lower) == len(expected) and read.lower_count == len(lower)
        assert read.id_range == ((min(expected), max(expected)) if expected else (0, -1))
        # In one pass (a load into empty lower tiers): the rows handed on as the blocks are checked are the same.
        checking = CheckedChain(chain)
        streamed = [(i, (-1, row)) for ids, rows in checking for i, row in zip(ids.tolist(), rows.tolist())]
        assert dict(streamed) == lower and len(streamed) == len(lower)
        assert as_dict(checking.records.pooled) == as_dict(read.pooled)


def test_a_save_holding_an_id_twice_is_refused() -> None:
    with tempfile.TemporaryDirectory() as directory:
        chain = saved_chain(directory, [(records([5, 6, 7, 8, 9, 5], BASE.width, 0.0), [])])
        with pytest.raises(StorageError, match="holds an ID in two records of one save"):
            read_chain(chain)


@pytest.mark.parametrize("damaged", [0, 1, 2, 3])
def test_a_damaged_block_is_reported_wherever_it_is(damaged: int) -> None:
    # Blocks are checked by several threads at once: a damaged first, middle or last block must fail the read.
    with tempfile.TemporaryDirectory() as directory:
        chain = saved_chain(directory, [(records(list(range(100, 120)), BASE.width, 0.0), [])])
        folder, entry = chain[0]
        assert len(entry["blocks"]) == 4
        with open(os.path.join(folder, entry["file"]), "r+b") as f:
            f.seek(entry["blocks"][damaged]["rows"]["offset"] + 3)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x10]))
        with pytest.raises(StorageError, match="the checksum of rows of table 't' does not match"):
            read_chain(chain)


@settings(deadline=None)
@given(st.lists(st.integers(0, 2**63 - 1), max_size=50), st.integers(1, 6))
def test_row_blocks_partition_the_ids(ids: List[int], buckets: int) -> None:
    ids_t = torch.tensor(ids, dtype=torch.int64)
    owners = torch.stack([dataclasses.replace(BASE, bucket=b, buckets=buckets).owns(ids_t) for b in range(buckets)])
    assert bool((owners.sum(0) == 1).all())
    torch.testing.assert_close(owners.int().argmax(0), reference.hash_rank(ids_t, buckets), rtol=0, atol=0)


def test_plain_tables_own_their_row_range() -> None:
    layout = dataclasses.replace(BASE, hash_ids=False, row_offset=16, rows=16)
    assert layout.owns(torch.tensor([15, 16, 31, 32])).tolist() == [False, True, True, False]
    assert layout.to_global(torch.tensor([0, 15])).tolist() == [16, 31]


def column_shard(col0: int, cols: int, ids: List[int], full: torch.Tensor, row_state: torch.Tensor) -> tuple:
    """A saved column shard of ``full`` ([n, 8] weights; element state = weights * 10) with its row state."""
    layout = dataclasses.replace(BASE, col0=col0, cols=cols)
    weights = full[:, col0:col0 + cols]
    rows = torch.cat([weights, weights * 10, row_state[:, None]], dim=1)
    order = torch.randperm(len(ids))  # saved in slot order, not ID order
    state = torch.zeros(len(ids), dtype=torch.int64)
    return layout, ShardRows(torch.tensor(ids)[order], torch.arange(len(ids))[order], state, rows[order])


def test_columns_joined_and_cut_like_slices() -> None:
    ids = [50, 3, 17, 99]
    full = torch.randn(4, 8)
    order = torch.argsort(torch.tensor(ids))
    left = column_shard(0, 4, ids, full, torch.full((4,), 2.0))
    right = column_shard(4, 4, ids, full, torch.full((4,), 4.0))
    joined = assemble(BASE, [left, right])
    assert joined.ids.tolist() == sorted(ids)
    torch.testing.assert_close(joined.rows[:, :8], full[order])
    torch.testing.assert_close(joined.rows[:, 8:16], full[order] * 10)
    torch.testing.assert_close(joined.rows[:, 16], torch.full((4,), 3.0))  # column-weighted mean of 2 and 4
    middle = assemble(dataclasses.replace(BASE, col0=2, cols=4), [left, right])
    torch.testing.assert_close(middle.rows[:, :4], full[order][:, 2:6])
    torch.testing.assert_close(middle.rows[:, 4:8], full[order][:, 2:6] * 10)


def test_missing_columns_and_disagreeing_shards_are_errors() -> None:
    ids, full = [1, 2], torch.randn(2, 8)
    left = column_shard(0, 4, ids, full, torch.zeros(2))
    with pytest.raises(StorageError, match="cover columns"):
        assemble(BASE, [left])
    other = column_shard(4, 4, [1, 3], full, torch.zeros(2))
    with pytest.raises(StorageError, match="hold different IDs"):
        assemble(BASE, [left, other])

"""KEY_VALUE tables in stock state_dict() (one rank): torch.distributed.checkpoint round trips every row from every
tier with its optimizer state, in-place writes reach the tiers, and incomplete or misplaced loads are refused with
the model unchanged. The oracle is the saved model itself (eval lookups read whichever tier holds a row), and two
more training steps on both. The 2-rank round trips (2 -> 2, 2 -> 1) are in the conformance checkpoint script."""

from __future__ import annotations

import glob
import os
import tempfile
from typing import Iterator, List, Tuple, Type

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
import torchrec
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.api import CheckpointException
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.checkpoint import sharded
from torchrec_ascend.checkpoint.key_value_state import TableView, _InOrder
from torchrec_ascend.checkpoint.sharded import WINDOW_BYTES
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.kernels.key_value import cache_metrics
from torchrec_ascend.native import memory
from torchrec_ascend.native.memory import plain_empty

pytestmark = pytest.mark.usefixtures("one_rank_group")
ROWS, DIM = 256, 8


@pytest.fixture
def disk() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        yield directory


def model(disk: str, rows: int = ROWS, dim: int = DIM, optimizer: Type[torch.optim.Optimizer] = RowWiseAdagrad
          ) -> DistributedModelParallel:
    torch.manual_seed(0)
    ebc = torchrec.EmbeddingBagCollection(tables=[
        HashEmbeddingBagConfig(name="user", embedding_dim=dim, num_embeddings=rows, feature_names=["uid"],
                               init_seed=3),
        torchrec.EmbeddingBagConfig(name="plain", embedding_dim=dim, num_embeddings=rows, feature_names=["p"]),
    ])
    apply_optimizer_in_backward(optimizer, ebc.parameters(), {"lr": 0.1})
    sharders = get_default_hybrid_sharders()
    constraints = {name: ParameterConstraints(
        sharding_types=["table_wise"], compute_kernels=["key_value"], cache_params=CacheParams(load_factor=0.05),
        key_value_params=KeyValueParams(l2_cache_size=2e-6, ssd_storage_directory=disk)) for name in ("user", "plain")}
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                    constraints=constraints).plan(ebc, sharders)
    return DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(torch.distributed.group.WORLD),
                                    device=torch.device("cpu"), plan=plan, sharders=sharders)


def batch(seed: int) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(seed)
    users = torch.randint(0, 120, (6,), generator=gen) * 1_000_003 + 2**40
    plain = torch.randint(0, ROWS, (6,), generator=gen)
    return KeyedJaggedTensor.from_lengths_sync(keys=["uid", "p"], values=torch.cat([users, plain]),
                                               lengths=torch.ones(12, dtype=torch.long))


def train(dmp: DistributedModelParallel, steps: range) -> None:
    dmp.train()
    for step in steps:
        dmp(batch(step)).values().sum().backward()


def lookups(dmp: DistributedModelParallel, steps: range) -> torch.Tensor:
    dmp.eval()
    with torch.no_grad():
        out = torch.cat([dmp(batch(step)).values() for step in steps])
    dmp.train()
    return out


def both(dmp: DistributedModelParallel) -> dict:
    return {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}


def test_dcp_round_trip_restores_every_tier_and_trains_on_identically(disk: str) -> None:
    saved = model(disk)
    train(saved, range(40))
    tiers = cache_metrics(saved)["user"]
    assert tiers["disk_rows"] > 0 and tiers["host_rows"] > 0, "the rows must live in every tier for this to prove much"
    dcp.save(both(saved), checkpoint_id=f"{disk}/ckpt")
    loaded = model(disk)
    state = both(loaded)
    dcp.load(state, checkpoint_id=f"{disk}/ckpt")
    loaded.load_state_dict(state["model"])
    loaded.fused_optimizer.load_state_dict(state["optim"])
    assert torch.equal(lookups(loaded, range(40)), lookups(saved, range(40)))
    train(saved, range(40, 42))
    train(loaded, range(40, 42))  # optimizer state came back too: the next updates agree bit for bit
    assert torch.equal(lookups(loaded, range(42)), lookups(saved, range(42)))


def test_a_load_reads_no_row_back(disk: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # load_state_dict hands TorchRec's own pre-load hook a KEY_VALUE table's weight entry; handing it the table's
    # windows made the hook concatenate them, reading every row of every tier back (a 2 GB table: 110 s, not 3).
    saved = model(disk)
    train(saved, range(10))
    dcp.save(both(saved), checkpoint_id=f"{disk}/ckpt")
    loaded = model(disk)
    state = both(loaded)
    reads = []
    read = TableView.read
    monkeypatch.setattr(TableView, "read", lambda view, *args: reads.append((view.name, args)) or read(view, *args))
    dcp.load(state, checkpoint_id=f"{disk}/ckpt")
    loaded.load_state_dict(state["model"])
    loaded.load_state_dict({}, strict=False)  # a partial (dense-only) state_dict: the tables stay as they are
    assert reads == []
    monkeypatch.undo()
    assert torch.equal(lookups(loaded, range(10)), lookups(saved, range(10)))


def test_windows_read_in_any_order_hold_the_same_rows(disk: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Windows read front to back (DCP's save) come from one sequential pass over the tiers; windows read in any other
    # order look each ID up. The two must agree, for the weights and the optimizer state, on windows spanning the
    # cache's and the disk's blocks.
    monkeypatch.setattr(sharded, "WINDOW_BYTES", 40 * 4 * (DIM + 1))  # 40-row windows
    dmp = model(disk)
    train(dmp, range(40))
    tiers = cache_metrics(dmp)["user"]
    assert tiers["disk_rows"] > 0 and tiers["host_rows"] > 0, "the rows must live in every tier for this to prove much"
    state = both(dmp)
    windows = [s.tensor for s in state["model"]["embedding_bags.user.weight"].local_shards()] + \
        [s.tensor for s in state["optim"]["state"]["embedding_bags.user.weight"]["user.momentum1"].local_shards()]
    assert len(windows) == 2 * -(-ROWS // 40)
    looked_up = []
    lookup = TableView._looked_up
    monkeypatch.setattr(TableView, "_looked_up", lambda view, keys: looked_up.append(keys) or lookup(view, keys))
    front_to_back = [window.clone() for window in windows]
    assert looked_up == [], "windows read front to back come from the sequential pass"

    @settings(max_examples=30, deadline=None)
    @given(order=st.permutations(range(len(windows))))
    def agree(order: List[int]) -> None:
        read = {i: windows[i].clone() for i in order}
        assert all(torch.equal(read[i], front_to_back[i]) for i in order)

    agree()
    assert looked_up, "some windows were looked up"


@pytest.mark.parametrize("window_rows", [40, ROWS])
def test_a_windows_clone_is_memory_of_its_own(disk: str, monkeypatch: pytest.MonkeyPatch, window_rows: int) -> None:
    # DCP's save clones each window, and the clone may be the very rows read for it: never memory the table keeps.
    monkeypatch.setattr(sharded, "WINDOW_BYTES", window_rows * 4 * (DIM + 1))
    dmp = model(disk)
    train(dmp, range(40))
    before = lookups(dmp, range(10))
    state = both(dmp)
    parts = [state["model"]["embedding_bags.user.weight"], state["model"]["embedding_bags.user.weight_id"],
             state["optim"]["state"]["embedding_bags.user.weight"]["user.momentum1"]]
    windows = [shard.tensor for part in parts for shard in part.local_shards()]
    clones = [window.clone() for window in windows]
    expected = [torch.tensor(clone.numpy().copy()) for clone in clones]  # numpy's copy: no window code runs
    for clone in clones:
        clone.fill_(-7)
    assert all(torch.equal(window.clone(), want) for window, want in zip(windows, expected))
    assert torch.equal(lookups(dmp, range(10)), before)


def test_windows_read_across_a_batch_hold_their_ids_rows(disk: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A batch moves rows between the tiers: a pass over them begun before it must not go on pairing its IDs with rows.
    monkeypatch.setattr(sharded, "WINDOW_BYTES", 40 * 4 * (DIM + 1))  # 40-row windows
    dmp = model(disk)
    train(dmp, range(40))
    state = dmp.state_dict()
    windows = [s.tensor for s in state["embedding_bags.user.weight"].local_shards()]
    ids = torch.cat([s.tensor.clone() for s in state["embedding_bags.user.weight_id"].local_shards()]).squeeze(1)
    windows[0].clone()  # the pass begins
    train(dmp, range(40, 50))
    got = torch.cat([window.clone() for window in windows])
    held = ids >= 0
    dmp.eval()
    with torch.no_grad():  # a bag of one ID pools to its row
        lengths = torch.cat([torch.ones(int(held.sum())), torch.zeros(int(held.sum()))]).long()
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=["uid", "p"], values=ids[held], lengths=lengths)
        expected = dmp(kjt).values()[:, :DIM]
    assert torch.equal(got[held], expected)


def test_state_dict_entries_are_table_sized_windows(disk: str) -> None:
    dmp = model(disk, rows=400_000)
    train(dmp, range(3))
    state = both(dmp)
    weight = state["model"]["embedding_bags.user.weight"]
    assert tuple(weight.size()) == (400_000, DIM)
    assert len(weight.local_shards()) > 1, "a shard larger than a window must be cut into windows"
    assert all(s.tensor.numel() * 4 <= WINDOW_BYTES for s in weight.local_shards())
    momentum = state["optim"]["state"]["embedding_bags.user.weight"]["user.momentum1"]
    assert tuple(momentum.size()) == (400_000,), "the optimizer state is the table's, not the device cache's"
    ids = torch.cat([s.tensor.clone() for s in state["model"]["embedding_bags.user.weight_id"].local_shards()])
    held = ids[ids >= 0]
    assert held.numel() == torch.unique(held).numel() > 0, "every ID once"


def copy_into_plain_weights(dmp: DistributedModelParallel, weights: torch.Tensor,
                            columns: List[Tuple[int, int]]) -> None:
    """Copies ``weights`` into the plain table's state_dict windows in place, one ``(first, end)`` column piece
    after another, as TorchRec's test harness and DCP's load write them."""
    for shard in dmp.state_dict()["embedding_bags.plain.weight"].local_shards():
        rows = slice(shard.metadata.shard_offsets[0], shard.metadata.shard_offsets[0] + shard.tensor.shape[0])
        for first, end in columns:
            shard.tensor.narrow(1, first, end - first).copy_(weights[rows, first:end])


def plain_rows(dmp: DistributedModelParallel) -> torch.Tensor:
    """Every row of the plain table, looked up in eval (from whichever tier holds it)."""
    dmp.eval()
    with torch.no_grad():
        lengths = torch.cat([torch.zeros(ROWS), torch.ones(ROWS)]).long()
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=["uid", "p"], values=torch.arange(ROWS), lengths=lengths)
        return dmp(kjt).values()[:, DIM:]


def test_in_place_copy_writes_through_to_the_tiers(disk: str) -> None:
    # TorchRec's test harness sets a sharded model's weights by copy_ into its state_dict tensors.
    dmp = model(disk)
    train(dmp, range(5))
    weights = torch.randn(ROWS, DIM)
    copy_into_plain_weights(dmp, weights, [(0, DIM)])
    assert torch.equal(plain_rows(dmp), weights)


@settings(max_examples=8, deadline=None)
@given(cuts=st.lists(st.integers(1, DIM - 1), unique=True, max_size=3).map(sorted), data=st.data())
def test_column_pieces_copied_in_any_order_write_through(cuts: List[int], data: st.DataObject) -> None:
    # A checkpoint saved column-wise reaches a row-wise KEY_VALUE shard as column pieces of its windows (DCP narrows
    # them): each piece lands in its columns, the others stay as the pieces before wrote them.
    bounds = [0, *cuts, DIM]
    pieces = data.draw(st.permutations(list(zip(bounds, bounds[1:]))))
    weights = torch.randn(ROWS, DIM)
    with tempfile.TemporaryDirectory() as disk:
        dmp = model(disk)
        train(dmp, range(5))
        copy_into_plain_weights(dmp, weights, pieces)
        assert torch.equal(plain_rows(dmp), weights)


def test_a_partial_load_is_refused_and_leaves_the_table_as_it_was(disk: str) -> None:
    dmp = model(disk)
    train(dmp, range(10))
    before = lookups(dmp, range(10))
    shard = dmp.state_dict()["embedding_bags.plain.weight"].local_shards()[0]
    shard.tensor.narrow(0, 0, 10).copy_(torch.zeros(10, DIM))  # 10 of 256 rows
    with pytest.raises(ConfigError, match=r"'plain'.*gave 80 of the 2048 values.*nothing was changed"):
        train(dmp, range(10, 11))
    assert torch.equal(lookups(dmp, range(10)), before)


def test_hash_rows_without_their_ids_are_refused(disk: str) -> None:
    trained = model(disk)
    train(trained, range(5))
    state = trained.state_dict()
    del state["embedding_bags.user.weight_id"]
    with pytest.raises(ConfigError, match=r"'user'.*without the ID of each row"):
        model(disk).load_state_dict(state)


def test_an_id_loaded_twice_is_refused_and_leaves_the_table_as_it_was(disk: str) -> None:
    dmp = model(disk)
    train(dmp, range(5))
    before = lookups(dmp, range(5))
    state = dmp.state_dict()
    ids = torch.full((ROWS, 1), -1, dtype=torch.int64)
    ids[:2] = 5
    for shard in state["embedding_bags.user.weight"].local_shards():
        shard.tensor.copy_(torch.zeros(shard.tensor.shape))
    for shard in state["embedding_bags.user.weight_id"].local_shards():
        row0 = shard.metadata.shard_offsets[0]
        shard.tensor.copy_(ids[row0:row0 + shard.tensor.shape[0]])
    with pytest.raises(ConfigError, match=r"'user'.*an ID twice.*nothing was changed"):
        train(dmp, range(5, 6))
    assert torch.equal(lookups(dmp, range(5)), before)


def test_in_place_ops_other_than_copy_are_refused(disk: str) -> None:
    window = model(disk).state_dict()["embedding_bags.plain.weight"].local_shards()[0].tensor
    with pytest.raises(RuntimeError, match="only copy_ writes through"):
        window.add_(1.0)


@pytest.mark.parametrize("other, refusal", [
    ({"dim": 16}, r"Size mismatch .*\[256, 8\].*\[256, 16\]\) for model\.embedding_bags\.plain\.weight"),
    ({"optimizer": torch.optim.Adam}, r"Missing key .*optim\.state\.embedding_bags\.user\.weight\.user\.iter"),
    ({"rows": 64}, r"Size mismatch .*\[256, 8\].*\[64, 8\]\) for model\.embedding_bags\.plain\.weight"),  # capacity
])
def test_a_checkpoint_of_another_dimension_optimizer_or_capacity_is_refused_naming_the_table(
        disk: str, other: dict, refusal: str) -> None:
    saved = model(disk)
    train(saved, range(5))
    dcp.save(both(saved), checkpoint_id=f"{disk}/ckpt")
    loaded = model(disk, **other)
    before = lookups(loaded, range(5))
    with pytest.raises(CheckpointException, match=refusal):
        dcp.load(both(loaded), checkpoint_id=f"{disk}/ckpt")
    assert torch.equal(lookups(loaded, range(5)), before)


@pytest.mark.parametrize("kept", [0.5, 0.9])  # the cut falls in the optimizer states of 'plain', then of 'user'
def test_a_dcp_load_cut_short_by_a_truncated_file_is_refused_and_changes_no_key_value_table(disk: str,
                                                                                            kept: float) -> None:
    saved = model(disk)
    train(saved, range(20))
    dcp.save(both(saved), checkpoint_id=f"{disk}/ckpt")
    (shard_file,) = glob.glob(f"{disk}/ckpt/*.distcp")
    os.truncate(shard_file, int(os.path.getsize(shard_file) * kept))
    loaded = model(disk)
    train(loaded, range(3))
    before = lookups(loaded, range(20))
    with pytest.raises(CheckpointException, match="corrupted"):
        dcp.load(both(loaded), checkpoint_id=f"{disk}/ckpt")
    # Each table whose rows came in without their optimizer state is refused once, at its next lookup.
    refused = []
    for _ in range(3):
        try:
            after = lookups(loaded, range(20))
            break
        except ConfigError as err:
            assert "which the same state_dict() handed out" in str(err) and "nothing was changed" in str(err)
            refused.append(str(err).split("'")[1])
    assert refused == (["plain"] if kept == 0.5 else ["user", "plain"])
    assert torch.equal(after, before)


def test_a_missing_shard_file_is_refused_before_any_table_changes(disk: str) -> None:
    saved = model(disk)
    train(saved, range(20))
    dcp.save(both(saved), checkpoint_id=f"{disk}/ckpt")
    (shard_file,) = glob.glob(f"{disk}/ckpt/*.distcp")
    os.remove(shard_file)
    loaded = model(disk)
    train(loaded, range(3))
    before = lookups(loaded, range(20))
    with pytest.raises(CheckpointException, match="No such file"):
        dcp.load(both(loaded), checkpoint_id=f"{disk}/ckpt")
    assert torch.equal(lookups(loaded, range(20)), before)  # nothing was staged: nothing to refuse either


def test_windows_read_in_order_reuse_the_memory_of_the_window_before_and_keep_none_after_the_last() -> None:
    # Blocks as a disk tier's pass gives them (records of plain_empty memory, 8 MiB each), read a window at a time.
    block_rows, width, blocks = 1 << 16, 32, 4
    addresses = []

    def records() -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for b in range(blocks):
            rows = torch.from_numpy(plain_empty((block_rows, width), np.float32)).fill_(b)
            addresses.append(rows.data_ptr())
            yield torch.arange(b * block_rows, (b + 1) * block_rows), rows

    in_order = _InOrder(records, width, blocks * block_rows, block_rows)
    for b in range(blocks):
        got = in_order.take(b * block_rows, torch.arange(b * block_rows, (b + 1) * block_rows), slice(0, width))
        assert got is not None and bool((got == b).all())
        assert (in_order.kept.nbytes > 0) == (0 < b < blocks - 1)  # what the window before freed, till the last
    assert addresses[2] in addresses[:2] and addresses[3] in addresses[:3], "later windows land in freed memory"
    assert memory._reusers == 0 and memory._kept == {}

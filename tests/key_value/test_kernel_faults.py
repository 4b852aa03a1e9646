"""KEY_VALUE kernel faults and bad input, in one process (a 1-rank gloo group): unwritable or full disk, corrupted
segment files, a checkpoint too large for host memory or changed while it loads, saves larger than a block,
metrics, and planning key_value on CPU."""

from __future__ import annotations

import errno
import glob
import os

import pytest
import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, Saver, get_default_hybrid_sharders
from torchrec_ascend.checkpoint import restore, saver
from torchrec_ascend.checkpoint.versions import resolve_chain
from torchrec_ascend.errors import CapacityError, StorageError
from torchrec_ascend.kernels import row_tier
from torchrec_ascend.kernels.key_value import cache_metrics
from torchrec_ascend.kernels.walk import sharded_kernels

CAPACITY, CACHE_ROWS, DIM = 256, 16, 8


pytestmark = pytest.mark.usefixtures("one_rank_group")


def model(directory: str, host_kb: float = 1.0) -> DistributedModelParallel:
    ebc = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name="user", embedding_dim=DIM, num_embeddings=CAPACITY, feature_names=["uid"])])
    apply_optimizer_in_backward(torch.optim.Adagrad, [ebc.embedding_bags["user"].weight], {"lr": 0.1, "eps": 1e-8})
    constraints = {"user": ParameterConstraints(
        sharding_types=["table_wise"], compute_kernels=["key_value"],
        cache_params=CacheParams(load_factor=CACHE_ROWS / CAPACITY),
        key_value_params=KeyValueParams(l2_cache_size=host_kb / 1024**2, ssd_storage_directory=directory),
    )}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), constraints=constraints)
    sharders = get_default_hybrid_sharders()
    return DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=torch.device("cpu"), plan=planner.plan(ebc, sharders), sharders=sharders)


def batch(ids: list) -> KeyedJaggedTensor:
    return KeyedJaggedTensor.from_lengths_sync(keys=["uid"], values=torch.tensor(ids), lengths=torch.tensor([len(ids)]))


def train(dmp: DistributedModelParallel, ids: list) -> None:
    dmp(batch(ids)).values().sum().backward()


def rows(dmp: DistributedModelParallel) -> dict:
    kernel = next(k for k in sharded_kernels(dmp))
    ids, values, _ = kernel.export_rows(0)
    return dict(zip(ids.tolist(), values))


def test_unwritable_disk_directory_is_a_clear_error(tmp_path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="user"):
        model(str(blocker / "disk"))


def test_full_disk_fails_the_batch_and_keeps_every_row(tmp_path, monkeypatch) -> None:
    dmp = model(str(tmp_path))
    for start in range(0, 120, 10):  # 120 IDs through a 16-row cache and a ~1 KiB host budget: spills to disk
        train(dmp, list(range(start, start + 10)))
    assert cache_metrics(dmp)["user"]["disk_rows"] > 0
    before = rows(dmp)

    def no_space(*args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", no_space)
    with pytest.raises(StorageError):
        for start in range(200, 260, 10):
            train(dmp, list(range(start, start + 10)))
    monkeypatch.undo()
    after = rows(dmp)
    assert set(before) <= set(after)
    for key, value in before.items():
        assert torch.equal(after[key], value), f"row of ID {key} changed or was lost"
    train(dmp, list(range(300, 310)))  # the kernel keeps working


def test_corrupted_segment_file_is_named(tmp_path) -> None:
    dmp = model(str(tmp_path))
    for start in range(0, 120, 10):
        train(dmp, list(range(start, start + 10)))
    segments = glob.glob(str(tmp_path / "**" / "*.rows"), recursive=True)
    assert segments
    with open(segments[0], "r+b") as f:  # flip bytes in the first record's row
        f.seek(20)
        f.write(b"\xff\xff\xff\xff")
    with pytest.raises(StorageError, match=os.path.basename(segments[0])):
        for start in range(0, 120, 10):
            train(dmp, list(range(start, start + 10)))


def test_a_load_larger_than_the_available_memory_is_refused_before_anything_changes(tmp_path, monkeypatch) -> None:
    dmp = model(str(tmp_path / "disk"))
    for start in range(0, 120, 10):  # rows in every tier
        train(dmp, list(range(start, start + 10)))
    Saver().save(dmp, str(tmp_path / "ckpt"))
    saved = rows(dmp)
    for start in range(0, 120, 10):  # the model moves on: a load must bring back `saved`
        train(dmp, list(range(start, start + 10)))
    trained = rows(dmp)
    assert any(not torch.equal(trained[k], saved[k]) for k in saved)
    monkeypatch.setattr(restore, "available_memory", lambda: 1024)  # the load needs ~10 KB
    with pytest.raises(CapacityError, match=r"table 'user'.*needs about .* GB of host memory.*more ranks"):
        Saver().load(dmp, str(tmp_path / "ckpt"))
    after = rows(dmp)
    assert after.keys() == trained.keys() and all(torch.equal(after[k], trained[k]) for k in trained)
    monkeypatch.undo()
    Saver().load(dmp, str(tmp_path / "ckpt"))
    loaded = rows(dmp)
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)


def test_a_checkpoint_changed_during_a_load_is_named_and_the_table_said_partially_loaded(tmp_path, monkeypatch):
    # A load checks every file, then reads the rows below the pool again as it restores them: a file changed in
    # between fails that second read, and the error says the table must be loaded again.
    dmp = model(str(tmp_path / "disk"))
    for start in range(0, 120, 10):
        train(dmp, list(range(start, start + 10)))
    ckpt = str(tmp_path / "ckpt")
    Saver().save(dmp, ckpt)
    saved = rows(dmp)
    directory, metadata = resolve_chain(ckpt)[-1]
    (shard,) = metadata["shards"]
    data, rows_entry = os.path.join(directory, shard["file"]), shard["blocks"][-1]["rows"]
    with open(data, "rb") as f:
        f.seek(rows_entry["offset"])
        intact = f.read(4)
    apply = saver.apply_restores

    def changed_then_applied(*args: object) -> object:
        with open(data, "r+b") as f:  # a lower-tier block, checked already
            f.seek(rows_entry["offset"])
            f.write(bytes(b ^ 0xFF for b in intact))
        return apply(*args)

    monkeypatch.setattr(saver, "apply_restores", changed_then_applied)
    with pytest.raises(StorageError, match=rf"{os.path.basename(data)}.*checksum.*'user' is now partially loaded"):
        Saver().load(dmp, ckpt)
    monkeypatch.undo()
    with open(data, "r+b") as f:
        f.seek(rows_entry["offset"])
        f.write(intact)
    Saver().load(dmp, ckpt)
    loaded = rows(dmp)
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)


def test_saves_read_and_write_the_rows_below_the_cache_a_block_at_a_time(tmp_path, monkeypatch) -> None:
    """The rows a full save and an increment take from below the cache are read and written at most ``BLOCK_ROWS``
    at a time (a table larger than memory streams), and the chain loads back into a fresh model (oracle: the rows at
    the save)."""
    monkeypatch.setattr(row_tier, "BLOCK_ROWS", 5)
    dmp = model(str(tmp_path / "disk"))
    path = str(tmp_path / "ckpt")
    for start in range(0, 60, 10):
        train(dmp, list(range(start, start + 10)))
    Saver().save(dmp, path)
    for start in range(0, 60, 10):  # every row changes again; most leave the 16-row cache for the host and disk
        train(dmp, list(range(start, start + 10)))
    Saver().save(dmp, path, incremental=True)
    saved = rows(dmp)
    for _, metadata in resolve_chain(path):  # the full save, then the increment: 60 IDs each
        (entry,) = metadata["shards"]
        sizes = [block["ids"]["shape"][0] for block in entry["blocks"]]
        assert sum(sizes) == 60 and sizes[0] <= CACHE_ROWS and len(sizes) > 3 and max(sizes[1:]) <= 5, sizes
    loaded = model(str(tmp_path / "loaded"))
    Saver().load(loaded, path)
    got = rows(loaded)
    assert got.keys() == saved.keys() and all(torch.equal(got[i], saved[i]) for i in saved)
    train(dmp, list(range(10)))  # changes since the increment: the IDs it drops are known once its blocks are read
    blocks, removed = next(iter(sharded_kernels(dmp))).export_shard(0, changed_only=True)
    with pytest.raises(RuntimeError, match="'user'.*consume the blocks first"):
        removed()
    exported = torch.cat([block.ids for block in blocks]).tolist()
    assert set(range(10)) <= set(exported) and removed().numel() == 0


def test_metrics_report_every_tier(tmp_path) -> None:
    dmp = model(str(tmp_path))
    for start in range(0, 60, 10):
        train(dmp, list(range(start, start + 10)))
    m = cache_metrics(dmp)["user"]
    for key in ("lookups", "hits", "evicted", "swapped_in", "swapped_out", "rejected", "cache_rows", "cache_bytes",
                "host_rows", "disk_rows"):
        assert key in m, key
    assert m["lookups"] == 60 and m["inserted"] == 60
    assert m["cache_rows"] == CACHE_ROWS  # the load factor's rows hold IDs; the not-admitted row is extra
    assert m["evicted"] == m["swapped_out"] >= 60 - m["cache_rows"]


def test_planner_plans_key_value_on_cpu_with_storage_estimates() -> None:
    ebc = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name="user", embedding_dim=DIM, num_embeddings=CAPACITY, feature_names=["uid"])], device=torch.device("meta"))
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=1, compute_device="cpu"),
        constraints={"user": ParameterConstraints(compute_kernels=["key_value"])},
    )
    plan = planner.plan(ebc, get_default_hybrid_sharders())
    assert plan.plan[""]["user"].compute_kernel == "key_value"
    option = next(o for o in planner._enumerator.enumerate(ebc, get_default_hybrid_sharders())
                  if o.compute_kernel == "key_value")
    assert option.shards[0].storage.ssd > 0 and option.shards[0].perf.total > 0


def test_eval_reads_rows_from_every_tier_and_inserts_nothing(tmp_path) -> None:
    dmp = model(str(tmp_path))
    for start in range(0, 120, 10):
        train(dmp, list(range(start, start + 10)))
    expected = rows(dmp)
    dmp.eval()
    with torch.no_grad():
        for start in range(0, 120, 10):  # one ID per bag: the pooled row is the row
            ids = list(range(start, start + 10))
            out = dmp(KeyedJaggedTensor.from_lengths_sync(
                keys=["uid"], values=torch.tensor(ids), lengths=torch.ones(10, dtype=torch.int64))).values()
            torch.testing.assert_close(out, torch.stack([expected[i] for i in ids]), rtol=0, atol=0)
        unknown = dmp(batch([10_000])).values()
    torch.testing.assert_close(unknown, torch.zeros(1, DIM))
    assert set(rows(dmp)) == set(expected), "eval must not insert IDs"

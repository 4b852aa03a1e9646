"""The KEY_VALUE disk tier failing mid-training (issue 29, item 3), in one process (a 1-rank gloo group).

While rows spill to disk, a write fails with ENOSPC or EIO (injected in the segment write, or for real: a
size-limited tmpfs that fills up, where a mount is allowed). The batch stops with a ``StorageError`` naming the table
and the disk folder, before any row is lost (rows that could not spill stay in the device cache or host memory); once
space is back the same batch is fed again and training goes on. Oracle: a FUSED table holding every row, trained on
the same batches minus the failed attempts: every row of the KEY_VALUE table, in whichever tier, equals it bit for bit
after every failure and at the end. A folder that cannot be written at start is refused at construction.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.errors import StorageError
from torchrec_ascend.kernels.key_value import cache_metrics, segment_file
from torchrec_ascend.kernels.walk import sharded_kernels

pytestmark = pytest.mark.usefixtures("one_rank_group")

CAPACITY, DIM, BATCH = 4096, 8, 160  # a batch brings 160 new IDs; the cache holds 256 rows


def model(directory: Optional[str], cache_rows: int = 256, host_kb: float = 2.0) -> DistributedModelParallel:
    """Table 'user' (Adagrad fused into backward): KEY_VALUE over ``directory``, or FUSED holding every row (None)."""
    ebc = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name="user", embedding_dim=DIM, num_embeddings=CAPACITY, feature_names=["uid"], init_seed=5)])
    apply_optimizer_in_backward(torch.optim.Adagrad, [ebc.embedding_bags["user"].weight], {"lr": 0.1, "eps": 1e-8})
    if directory is None:
        constraint = ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])
    else:
        constraint = ParameterConstraints(
            sharding_types=["table_wise"], compute_kernels=["key_value"],
            cache_params=CacheParams(load_factor=cache_rows / CAPACITY),
            key_value_params=KeyValueParams(l2_cache_size=host_kb / 1024**2, ssd_storage_directory=directory))
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                       constraints={"user": constraint})
    sharders = get_default_hybrid_sharders()
    return DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=torch.device("cpu"), plan=planner.plan(ebc, sharders), sharders=sharders)


def batches(count: int) -> Iterator[KeyedJaggedTensor]:
    """Batches of ``BATCH`` IDs: mostly new ones (they push older rows down to disk), some recent ones again (rows
    come back up), one ID per bag so every row gets its own gradient."""
    gen = torch.Generator().manual_seed(11)
    for step in range(count):
        fresh = torch.arange(step * 120, step * 120 + 120)
        again = torch.randint(0, max(1, step * 120), (BATCH - 120,), generator=gen)
        ids = torch.unique(torch.cat([fresh, again]))
        yield KeyedJaggedTensor.from_lengths_sync(keys=["uid"], values=ids, lengths=torch.ones_like(ids))


def train(dmp: DistributedModelParallel, batch: KeyedJaggedTensor) -> None:
    dmp(batch).values().pow(2).sum().backward()


def rows(dmp: DistributedModelParallel) -> Dict[int, torch.Tensor]:
    """Every ID's embedding row, from every tier."""
    ids, values, _ = next(iter(sharded_kernels(dmp))).export_rows(0)
    return dict(zip(ids.tolist(), values))


def assert_same_rows(kv: DistributedModelParallel, fused: DistributedModelParallel, when: str) -> int:
    got, expected = rows(kv), rows(fused)
    assert got.keys() == expected.keys(), f"{when}: IDs lost {sorted(expected.keys() - got.keys())[:8]}, " \
                                          f"extra {sorted(got.keys() - expected.keys())[:8]}"
    changed = [k for k in expected if not torch.equal(got[k], expected[k])]
    assert not changed, f"{when}: rows of IDs {changed[:8]} differ from FUSED ({len(changed)} of {len(expected)})"
    return len(expected)


def run_with_failures(kv: DistributedModelParallel, fused: DistributedModelParallel, steps: int,
                      disk_fails: Any, space_back: Any, directory: str) -> List[str]:
    """Train both models; when ``disk_fails(step)`` the KEY_VALUE batch must stop with a StorageError (checked: every
    row kept), then ``space_back()`` and the same batch goes again. Returns the errors seen."""
    errors = []
    for step, batch in enumerate(batches(steps)):
        if disk_fails(step):
            with pytest.raises(StorageError) as failure:
                train(kv, batch)
            message = str(failure.value)
            assert "table 'user'" in message and directory in message, message
            errors.append(message)
            assert_same_rows(kv, fused, f"after the failure at step {step}")
            space_back()
        train(kv, batch)
        train(fused, batch)
    return errors


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_a_failing_disk_stops_the_batch_keeps_every_row_and_training_resumes(tmp_path: Path, monkeypatch: Any,
                                                                            code: int) -> None:
    directory = str(tmp_path / "disk")
    kv, fused = model(directory), model(None)
    write = segment_file.pwrite_all
    failing = {"on": False}

    def injected(fd: int, data: memoryview, offset: int) -> None:
        if failing["on"]:  # half the records land on disk, then the write fails: a spill cut short
            write(fd, data[: len(data) // 2], offset)
            raise OSError(code, os.strerror(code))
        write(fd, data, offset)

    monkeypatch.setattr(segment_file, "pwrite_all", injected)

    def disk_fails(step: int) -> bool:
        failing.update(on=step in (6, 7, 11))
        return failing["on"]

    errors = run_with_failures(kv, fused, 14, disk_fails, lambda: failing.update(on=False), directory)
    assert len(errors) == 3 and all(os.strerror(code) in e for e in errors), errors
    stats = cache_metrics(kv)["user"]
    assert stats["disk_rows"] > 0 and stats["host_rows"] > 0, stats
    assert assert_same_rows(kv, fused, "at the end") == stats["cache_rows"] + stats["host_rows"] + stats["disk_rows"]


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs at ``tmp_path / "tmpfs"`` (skipped where this process may not mount one)."""
    where = tmp_path / "tmpfs"
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a size-limited tmpfs needs root here; the injected faults above still run")
    made = _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where))
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_real_filesystem_filling_up_stops_the_batch_and_training_resumes_once_it_grows(
    small_filesystem: Path,
) -> None:
    directory = str(small_filesystem)
    kv, fused = model(directory), model(None)
    def space_back() -> None:  # the operator frees space: the filesystem grows to 16 MiB
        grown = _mount("-o", "remount,size=16m", directory)
        assert grown.returncode == 0, grown.stderr

    # Train until a batch fails for real (ENOSPC from the kernel), then grow the filesystem and go on.
    errors = []
    for step, batch in enumerate(batches(16)):
        try:
            train(kv, batch)
        except StorageError as failure:
            message = str(failure)
            assert "table 'user'" in message and directory in message and os.strerror(errno.ENOSPC) in message, \
                message
            errors.append(message)
            assert_same_rows(kv, fused, f"after the disk filled up at step {step}")
            space_back()
            train(kv, batch)
        train(fused, batch)
    assert errors, "the 64 KiB filesystem never filled up: the test proves nothing"
    stats = cache_metrics(kv)["user"]
    assert stats["disk_rows"] > 0, stats
    assert assert_same_rows(kv, fused, "at the end") == stats["cache_rows"] + stats["host_rows"] + stats["disk_rows"]


def test_a_read_only_folder_is_refused_at_construction(small_filesystem: Path) -> None:
    remounted = _mount("-o", "remount,ro", str(small_filesystem))
    assert remounted.returncode == 0, remounted.stderr
    with pytest.raises(StorageError, match=rf"table 'user'.*'{small_filesystem}/rank0'.*Read-only file system"):
        model(str(small_filesystem))

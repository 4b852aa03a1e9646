"""Kill saving processes at random points and check what they leave behind (run by ``test_faults.py``).

``python kill_saves.py --dir D --trials N --seed S --out results.json``

Imports torch and torchrec once, then per trial forks a child that trains a one-rank model (a KEY_VALUE hash table
with its rows in cache, host memory and disk, and a FUSED hash table) one step at a time and saves after every
step, full and incremental in turn, reporting ``begin <version>`` and ``end <version> <seconds>`` on a pipe. Once a
save after the first is under way, the parent sleeps a random fraction of a save's duration and SIGKILLs the child.

Then, in the parent (one rank): every trial's path is loaded into a fresh model and compared, every row of every
tier, with a model trained for as many steps without any save (the oracle). The job then resumes: one more step
and an incremental save over the loaded one (which must clear the interrupted save), loaded again and compared.
Last, copies of a checkpoint are damaged (a data file truncated, a byte flipped, the metadata truncated) and each
load must raise StorageError naming the damaged file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import signal
import sys
import time
from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.checkpoint import Saver
from torchrec_ascend.checkpoint.saver import local_shards
from torchrec_ascend.checkpoint.versions import METADATA, all_versions, read_metadata, save_directory
from torchrec_ascend.errors import StorageError

DIM, CAPACITY, IDS_PER_STEP, POOL = 32, 1 << 16, 2000, 40_000
STARTUP_TIMEOUT_S = 120
LAST_TARGET = 5  # the interrupted save is one of 2..LAST_TARGET: full (odd) or incremental (even)


def build(disk: str) -> DistributedModelParallel:
    module = torchrec.EmbeddingBagCollection(tables=[
        HashEmbeddingBagConfig(name=name, embedding_dim=DIM, num_embeddings=CAPACITY, feature_names=[f"f_{name}"],
                               init_seed=seed)
        for name, seed in (("cached", 1), ("pooled", 2))
    ])
    apply_optimizer_in_backward(torch.optim.Adagrad, list(module.parameters()), {"lr": 0.05})
    constraints = {
        "cached": ParameterConstraints(
            sharding_types=["table_wise"], compute_kernels=["key_value"], cache_params=CacheParams(load_factor=0.08),
            key_value_params=KeyValueParams(l2_cache_size=0.5 / 1024, ssd_storage_directory=disk),
        ),
        "pooled": ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"]),
    }
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), constraints=constraints)
    sharders = get_default_hybrid_sharders()
    return DistributedModelParallel(module, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=torch.device("cpu"), plan=planner.plan(module, sharders), sharders=sharders)


def train_step(model: Any, step: int) -> None:
    gen = torch.Generator().manual_seed(step)
    ids = torch.randint(0, POOL, (2 * IDS_PER_STEP,), generator=gen) * 7919 + 11
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f_cached", "f_pooled"], values=ids, lengths=torch.full((2 * IDS_PER_STEP // 4,), 4)
    )
    out = model(kjt).values()
    (out * torch.randn(out.shape, generator=gen)).sum().backward()


def all_rows(model: Any) -> Dict[Tuple[str, int], torch.Tensor]:
    """(table, ID) -> packed row (weights and optimizer state) from every tier."""
    rows = {}
    for kernel, t, layout in local_shards(model):
        blocks, _ = kernel.export_shard(t)
        for block in blocks:
            rows.update({(layout.table, i): r for i, r in zip(block.ids.tolist(), block.rows)})
    return rows


def saving_child(path: str, store: str, pipe: int) -> None:
    """Train and save forever, reporting each save on ``pipe`` (runs in the forked child until killed)."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    model = build(os.path.join(path, "disk"))
    saver = Saver()
    step = 0
    while True:
        train_step(model, step)
        step += 1
        os.write(pipe, f"begin {step}\n".encode())
        started = time.perf_counter()
        info = saver.save(model, os.path.join(path, "ckpt"), incremental=step % 2 == 0)  # 1 full, 2 incremental...
        os.write(pipe, f"end {info.version} {time.perf_counter() - started:.4f}\n".encode())


def run_trial(path: str, store: str, rng: random.Random) -> Dict[str, Any]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            saving_child(path, store, write_end)
        finally:
            os._exit(1)
    os.close(write_end)
    ended, durations, buffer, in_save = 0, [], b"", False
    target = rng.randint(2, LAST_TARGET)  # the save to interrupt
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    kill_at = None
    while True:
        now = time.monotonic()
        if kill_at is not None and now >= kill_at:
            break
        if now > deadline:
            os.kill(pid, signal.SIGKILL)
            raise RuntimeError("the saving child made no progress")
        timeout = max(0.0, (kill_at or deadline) - now)
        ready, _, _ = select.select([read_end], [], [], timeout)
        if not ready:
            continue
        chunk = os.read(read_end, 4096)
        if not chunk:
            raise RuntimeError("the saving child died on its own")
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            word, version, *rest = line.decode().split()
            if word == "end":
                ended, in_save = int(version), False
                durations.append(float(rest[0]))
            elif word == "begin":
                in_save = True
                if int(version) == target:  # kill somewhere inside this save (if it takes as long as the last)
                    kill_at = time.monotonic() + rng.uniform(0.0, 0.8 * durations[-1])
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(read_end)
    return {"path": path, "target": target, "last_reported": ended, "killed_in_save": in_save,
            "save_seconds": durations[-1]}


def verify(trial: Dict[str, Any], seed_path: str) -> Dict[str, Any]:
    """Load the trial's path, compare with a model trained as many steps; a new save must clear the interrupted one."""
    root = os.path.join(trial["path"], "ckpt")
    incomplete = [v for v in all_versions(root) if read_metadata(root, v) is None]
    model = build(os.path.join(seed_path, "disk"))
    info = Saver().load(model, root)
    reference = build(os.path.join(seed_path, "disk"))
    for step in range(info.version):  # save v was written after step v
        train_step(reference, step)
    mine, theirs = all_rows(model), all_rows(reference)
    same = mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    train_step(model, info.version)  # the job resumes: one more step, then its next (incremental) save
    resumed = Saver().save(model, root, incremental=True)
    left = [v for v in all_versions(root) if read_metadata(root, v) is None]
    again = build(os.path.join(seed_path, "disk"))
    Saver().load(again, root)
    after, reloaded = all_rows(model), all_rows(again)
    same_after = after.keys() == reloaded.keys() and all(torch.equal(after[k], reloaded[k]) for k in after)
    return {**trial, "loaded": info.version, "kind": info.kind, "rows": len(mine), "same_rows": same,
            "incomplete_before": incomplete, "incomplete_after": left, "resumed_kind": resumed.kind,
            "resumed_chain": list(resumed.chain), "resumed_same_rows": same_after}


def damaged_loads(root: str, scratch: str) -> Dict[str, str]:
    """Load copies of ``root`` damaged three ways; the StorageError message of each (or what happened instead)."""
    latest = max(v for v in all_versions(root) if read_metadata(root, v) is not None)
    out = {}
    for damage in ("truncate_data", "flip_byte", "truncate_metadata"):
        copy = os.path.join(scratch, damage)
        shutil.copytree(root, copy)
        directory = save_directory(copy, latest)
        data = os.path.join(directory, sorted(f for f in os.listdir(directory) if f.endswith(".data"))[0])
        if damage == "truncate_data":
            os.truncate(data, os.path.getsize(data) // 2)
        elif damage == "flip_byte":  # in the middle of the first shard's rows
            rows = read_metadata(copy, latest)["shards"][0]["blocks"][0]["rows"]
            with open(data, "r+b") as f:
                f.seek(rows["offset"] + rows["nbytes"] // 2)
                byte = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([byte[0] ^ 0xFF]))
        else:
            meta = os.path.join(directory, METADATA)
            os.truncate(meta, os.path.getsize(meta) // 2)
        try:
            Saver().load(build(os.path.join(scratch, "disk")), copy)
            out[damage] = "loaded without an error"
        except StorageError as err:
            out[damage] = f"StorageError: {err}"
        out[damage + "_file"] = data if damage != "truncate_metadata" else os.path.join(directory, METADATA)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    trials: List[Dict[str, Any]] = []
    for i in range(args.trials):
        path = os.path.join(args.dir, f"trial{i}")
        os.makedirs(path)
        trials.append(run_trial(path, os.path.join(args.dir, f"store{i}"), rng))
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(args.dir, 'store')}", rank=0, world_size=1)
    results = [verify(trial, args.dir) for trial in trials]
    damaged = damaged_loads(os.path.join(trials[0]["path"], "ckpt"), os.path.join(args.dir, "damaged"))
    with open(args.out, "w") as f:
        json.dump({"trials": results, "damaged": damaged}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

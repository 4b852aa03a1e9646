"""Damaged and crafted checkpoints loaded into a 2-rank model must leave it exactly as it was (run by
``test_atomic_load.py`` with ``run_distributed``; ``--cases`` lists the damages).

Model A (two FUSED row-wise hash tables with eviction and admission state, a KEY_VALUE plain table; the
conformance checkpoint model) trains and saves a full save and an increment. Model B, built the same way, trains on
other batches; model C is built and never trained (its KEY_VALUE tiers are empty, so a load stores their rows as it
checks them, and must empty them again when it fails). For each damage, rank 0 copies the checkpoint and damages the
copy; every rank loads it into B, then into C, and records what was raised and whether every row (weights and
optimizer state, every tier), slot, counter and step of the model's shards is unchanged. Last, the undamaged
checkpoint is loaded into B and C, which must then hold A's rows (else the comparison could not tell a load from
none).

Damages (``case["damage"]``): ``flip_latest`` / ``flip_full`` (a byte of the last table shard's rows in rank 1's
data file of the increment / of the full save), ``path_escape`` (that shard's file named ``../../elsewhere/...``,
where a copy waits), ``bad_id_map`` (that shard's saved ID-map count off by 3: only a trial restore sees it),
``truncate`` (rank 1's data file of the increment cut in half), ``flip_plain`` (a byte of the KEY_VALUE plain
table's rows in the last block of its data file of the full save), ``negative_id`` (a record of that table without a
cache slot in the increment given ID -5, its checksum made to match: only the check of the IDs sees it).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from typing import Any, Dict, List, NoReturn, Tuple

import numpy as np
import torch.distributed as dist

from torchrec_ascend.checkpoint import Saver
from torchrec_ascend.checkpoint.files import read_array
from torchrec_ascend.checkpoint.saver import local_shards
from torchrec_ascend.checkpoint.versions import METADATA, save_directory
from torchrec_ascend.conformance_tests.plugin import checkpoint as model_kit
from torchrec_ascend.conformance_tests.plugin.runner import start_rank
from torchrec_ascend.shutdown import end_rank

SPEC = {"kind": "ebc", "policy": "evict", "optimizer": "adagrad"}
RANK1 = "rank-00001-of-00002.data"


def snapshot(model: Any) -> Dict[Tuple[str, int, int], Any]:
    """Everything a load could change in this rank's shards: per shard its records (ID -> slot, last use, packed
    row bytes) from every tier, its counters and step, and the optimizer's step count."""
    out: Dict[Tuple[str, int, int], Any] = {}
    for kernel, t, layout in local_shards(model):
        blocks, _ = kernel.export_shard(t)
        records = {int(i): (int(s), int(u), r.numpy().tobytes())
                   for b in blocks for i, s, u, r in zip(b.ids, b.slots, b.last_used, b.rows)}
        table = kernel.slot_table(t)
        out[(layout.table, layout.col0, layout.bucket)] = (records, table.stats(), table.step,
                                                           kernel.optimizer_iteration())
    return out


def last_rank1_shard(metadata: Dict[str, Any]) -> Dict[str, Any]:
    """The last hash-table shard entry of rank 1's data file that holds records."""
    return [s for s in metadata["shards"] if s["file"] == RANK1 and s["blocks"] and s["layout"]["hash_ids"]][-1]


def damage(root: str, kind: str, elsewhere: str) -> str:
    """Damage the checkpoint at ``root`` as ``kind`` says; returns the file the error must name."""
    version = 1 if kind in ("flip_full", "flip_plain") else 2
    if kind == "negative_id":
        return crafted_id(save_directory(root, 2), -5)
    directory = save_directory(root, version)
    meta_path = os.path.join(directory, METADATA)
    with open(meta_path) as f:
        metadata = json.load(f)
    shard = last_rank1_shard(metadata)
    if kind == "flip_plain":
        shard = next(s for s in metadata["shards"] if s["blocks"] and not s["layout"]["hash_ids"])
    data = os.path.join(directory, shard["file"])
    if kind in ("flip_latest", "flip_full", "flip_plain"):
        rows = shard["blocks"][-1]["rows"]
        with open(data, "r+b") as f:
            f.seek(rows["offset"] + rows["nbytes"] // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x10]))
        return data
    if kind == "truncate":
        os.truncate(data, os.path.getsize(data) // 2)
        return data
    if kind == "path_escape":
        os.makedirs(elsewhere, exist_ok=True)
        shutil.copy(data, elsewhere)
        shard["file"] = os.path.join("..", "..", os.path.basename(elsewhere), RANK1)
        metadata["files"][shard["file"]] = metadata["files"][RANK1]
    elif kind == "bad_id_map":
        shard["state"]["next_fresh"] += 3
    with open(meta_path, "w") as f:
        json.dump(metadata, f)
    return meta_path if kind == "path_escape" else data


def crafted_id(directory: str, value: int) -> str:
    """Give the first record without a cache slot of the plain table's shard in the save at ``directory`` the ID
    ``value``, with a checksum to match; returns its data file."""
    meta_path = os.path.join(directory, METADATA)
    with open(meta_path) as f:
        metadata = json.load(f)
    shard = next(s for s in metadata["shards"] if s["blocks"] and not s["layout"]["hash_ids"])
    data = os.path.join(directory, shard["file"])
    for block in shard["blocks"]:
        slots = read_array(data, block["slots"], "slots")
        if (slots < 0).any():
            ids = read_array(data, block["ids"], "ids").copy()
            ids[int(np.flatnonzero(slots < 0)[0])] = value
            with open(data, "r+b") as f:
                f.seek(block["ids"]["offset"])
                f.write(ids.tobytes())
            block["ids"]["crc32"] = zlib.crc32(ids.tobytes())
            with open(meta_path, "w") as f:
                json.dump(metadata, f)
            return data
    raise AssertionError("the increment holds no record of the plain table without a cache slot")


def gather(value: Any, pg: Any) -> List[Any]:
    out: List[Any] = [None] * pg.size()
    dist.all_gather_object(out, value, group=pg)
    return out


def main() -> NoReturn:
    args, pg = start_rank(__doc__)
    work = gather(tempfile.mkdtemp(prefix="atomic_loads_") if pg.rank() == 0 else None, pg)[0]
    ckpt = os.path.join(work, "ckpt")
    saver = Saver(process_group=pg)
    a = model_kit.build(SPEC, "row_wise", "fused", pg, os.path.join(work, "disk_a"))
    for step in range(5):
        model_kit.train_step(a, SPEC["kind"], step, pg)
        if step in (2, 4):
            saver.save(a, ckpt, incremental=step == 4)
    saved = snapshot(a)
    b = model_kit.build(SPEC, "row_wise", "fused", pg, os.path.join(work, "disk_b"))
    for step in range(20, 23):
        model_kit.train_step(b, SPEC["kind"], step, pg)
    c = model_kit.build(SPEC, "row_wise", "fused", pg, os.path.join(work, "disk_c"))
    models = {"trained": (b, snapshot(b)), "fresh": (c, snapshot(c))}
    results = []
    for case in json.loads(args.cases):
        copy = os.path.join(work, "copies", case["damage"], "ckpt")
        named = None
        if pg.rank() == 0:
            shutil.copytree(ckpt, copy)
            named = damage(copy, case["damage"], os.path.join(work, "copies", case["damage"], "elsewhere"))
        named = gather(named, pg)[0]
        for name, (model, before) in models.items():
            try:
                saver.load(model, copy)
                raised, message = "", ""
            except Exception as error:  # the point of every case: record what was raised
                raised, message = type(error).__name__, str(error)
            outcomes = gather({"raised": raised, "message": message, "unchanged": snapshot(model) == before}, pg)
            results.append({**case, "model": name, "file": named, "ranks": outcomes})
    clean = True
    for model, before in models.values():
        saver.load(model, ckpt)
        clean &= all(gather(snapshot(model) == saved and saved != before, pg))
    if pg.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"results": results, "clean_load_restores_a": clean}, f, indent=1)
        shutil.rmtree(work, ignore_errors=True)
    end_rank()


if __name__ == "__main__":
    main()

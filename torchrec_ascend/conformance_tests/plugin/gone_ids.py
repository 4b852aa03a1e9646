"""No resurrection: an ID that leaves a shard between a full save and an incremental one stays gone after a load.

One case of ``plugin/checkpoint.py`` (``{"action": "gone_ids", "kind": "ebc", "sharding_type": ..., "kernel":
"fused", "load_world_size": N}``). A FUSED hash table of ``reused_rows.SHARD_ROWS`` rows per shard
(``overflow="evict"``, LRU, row-wise Adagrad) trains on the IDs of ``A`` (they fit), is saved in full, then trains on
new IDs (many more than the shards hold, so most of ``A`` is evicted: dropped, gone from the shard) and on two IDs of
``A`` again (back with new rows), and is saved incrementally. The chain is loaded into a fresh model of the same
layout (restored exactly) and into one of ``N`` ranks, table-wise (resharded).

Oracle: the model that never stopped, at each save: its IDs and rows read from its shards (``export_rows``), not
from the Saver's files. Reported: ``gone`` (IDs held at the full save and not at the incremental one: the case
proves nothing without them), ``returned`` (IDs of ``A`` brought back, held at the last save), ``save_kinds``, and
per load (``same``,
``resharded``): ``resurrected`` (IDs loaded that the model did not hold at the last save), ``lost`` (IDs it held
that were not loaded), ``rows_err`` (the largest difference of a loaded row from the saved one); ``residency``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.checkpoint import Saver
from torchrec_ascend.conformance_tests.launch import script_device
from torchrec_ascend.conformance_tests.plugin.reused_rows import FEATURE, build, final_rows, upstream
from torchrec_ascend.conformance_tests.plugin.runner import first_ranks, residency, shared_directory

PER_RANK = 8  # IDs per rank per step, 4 bags of 2
FULL_STEPS, INCREMENT_STEPS = 2, 4  # steps before the full save; then before the incremental save
RETURNING = 2  # IDs of A brought back in the last step


def batch_ids(step: int, rank: int, world: int) -> List[List[int]]:
    """``rank``'s bags: ``A`` (``PER_RANK * world`` IDs) in every step before the full save; then new IDs, each once;
    the last step also brings back the first :data:`RETURNING` IDs of ``A`` (rank 0)."""
    if step < FULL_STEPS:
        ids = [10**12 + 7919 * (rank * PER_RANK + k) for k in range(PER_RANK)]
    else:
        ids = [3 * 10**12 + 104_729 * (((step - FULL_STEPS) * world + rank) * PER_RANK + k) for k in range(PER_RANK)]
        if step == FULL_STEPS + INCREMENT_STEPS - 1 and rank == 0:
            ids[:RETURNING] = [10**12 + 7919 * k for k in range(RETURNING)]
    return [ids[k:k + 2] for k in range(0, PER_RANK, 2)]


def train_step(dmp: Any, step: int, pg: Any) -> Any:
    bags = batch_ids(step, pg.rank(), pg.size())
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[FEATURE], values=torch.tensor([i for bag in bags for i in bag], dtype=torch.int64),
        lengths=torch.tensor([len(bag) for bag in bags]),
    ).to(script_device())
    out = dmp(kjt).to_dict()[FEATURE]
    (out * upstream(step, pg.rank(), len(bags)).to(out.device)).sum().backward()
    return kjt, out


def compare(loaded: Dict[int, torch.Tensor], saved: Dict[int, torch.Tensor], prefix: str) -> Dict[str, Any]:
    common = loaded.keys() & saved.keys()
    return {
        f"{prefix}_resurrected": len(loaded.keys() - saved.keys()),
        f"{prefix}_lost": len(saved.keys() - loaded.keys()),
        f"{prefix}_rows_err": max(((loaded[i] - saved[i]).abs().max().item() for i in common), default=0.0),
    }


def run(case: Dict[str, Any], world: Any) -> Dict[str, Any]:
    with shared_directory("gone-ids-", world) as directory:
        return _run(case, world, directory)


def _run(case: Dict[str, Any], world: Any, directory: str) -> Dict[str, Any]:
    path = os.path.join(directory, "ckpt")
    shards = world.size() if case["sharding_type"] == "row_wise" else 1
    model = build(case["kernel"], case["sharding_type"], world, os.path.join(directory, "disk"))
    saver = Saver(process_group=world)
    for step in range(FULL_STEPS + INCREMENT_STEPS):
        if step == FULL_STEPS:
            at_full = final_rows(model, world)
            saver.save(model, path)
        kjt, out = train_step(model, step, world)
    saved = final_rows(model, world)
    saver.save(model, path, incremental=True)
    where = residency(parameters=model, optimizer=model.fused_optimizer, inputs=kjt, outputs=out)
    returning = {10**12 + 7919 * k for k in range(RETURNING)}
    result: Dict[str, Any] = {"gone": len(at_full.keys() - saved.keys()), "returned": len(returning & saved.keys()),
                              "save_kinds": [info.kind for info in Saver.versions(path)], "residency": where}
    same = build(case["kernel"], case["sharding_type"], world, os.path.join(directory, "disk-same"))
    Saver(process_group=world).load(same, path)
    result.update(compare(final_rows(same, world), saved, "same"))
    pg = first_ranks(world, case["load_world_size"])
    if pg is not None:  # the same table (as many rows), on fewer ranks, table-wise
        other = build(case["kernel"], "table_wise", pg, os.path.join(directory, "disk-other"), shards=shards)
        Saver(process_group=pg).load(other, path)
        result.update(compare(final_rows(other, pg), saved, "resharded"))
    dist.barrier(group=world)
    return result


"""The shared ``main()`` of the suite's scripts: one process group, many cases, results merged over ranks.

A script defines ``run_case(case, pg) -> dict`` and calls :func:`main`. Each case runs on every rank; an exception
is printed at once (the other ranks may be left waiting in a collective, so the group has a timeout) and reported per
case. Rank 0 writes ``{"info": {...}, "results": [...]}`` to ``--out``, as :func:`launch.run_distributed` expects.

A case that trains reports where its tensors lived with :func:`residency` (the ``residency`` key: the device types
of the model's parameters, its optimizer state, its inputs and its outputs, over all ranks); the suite fails a case
whose tensors lived anywhere but the device under test.

Example::

    if __name__ == "__main__":
        main(__doc__, run_case, worst=("fwd_err",), totals=("evicted",))
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import sys
import traceback
from typing import Any, Callable, Dict, List, NoReturn, Sequence, Set, Tuple

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

from torchrec_ascend.conformance_tests.launch import process_group_backend, script_device
from torchrec_ascend.shutdown import end_rank

COLLECTIVE_TIMEOUT_S = 120


def devices_of(obj: Any) -> Set[str]:
    """The device types of every tensor in ``obj``: a tensor, a ShardedTensor, a TorchRec jagged or keyed tensor, a
    module (its parameters: buffers such as the hash tables' ID maps live on the host by design), an optimizer (its
    state), or dicts, lists and tuples of these.

    Example::

        devices_of({"w": torch.zeros(2), "out": [torch.ones(1)]})   # {'cpu'}
    """
    if isinstance(obj, torch.Tensor):
        return {obj.device.type}
    if isinstance(obj, (JaggedTensor, KeyedJaggedTensor, KeyedTensor)):
        return devices_of(obj.values())
    if hasattr(obj, "local_shards"):  # ShardedTensor
        return set().union(*(devices_of(s.tensor) for s in obj.local_shards()))
    if isinstance(obj, torch.nn.Module):
        return devices_of(list(obj.parameters()))
    if isinstance(obj, torch.optim.Optimizer):
        return devices_of(list(obj.state.values()))
    if isinstance(obj, dict):
        return devices_of(list(obj.values()))
    if isinstance(obj, (list, tuple)):
        return set().union(*(devices_of(o) for o in obj))
    return set()


def residency(**parts: Any) -> Dict[str, List[str]]:
    """Where each part of a case lived: part name -> the sorted device types of its tensors (see :func:`devices_of`).

    Pass ``parameters`` (the trained model), ``optimizer`` (its optimizers; stateless ones hold no tensors),
    ``inputs`` (batches) and ``outputs`` (forward results); put the result under the case's ``residency`` key.

    Example::

        return {..., "residency": residency(parameters=dmp, optimizer=[dmp.fused_optimizer], inputs=batch,
                                            outputs=out)}
    """
    return {name: sorted(devices_of(obj)) for name, obj in parts.items()}


def count_transfers(*models: torch.nn.Module) -> Dict[str, Dict[str, int]]:
    """Count, on the emulated NPU, the host<->device copies and host syncs of the ``models``' per-batch parts, by
    kernel.

    Wraps the forward of every hash kernel (``fused_hash``, ``key_value``: ID mapping, new rows, the lookup) and of
    every hash row-wise input dist (``row_wise_input_dist``), and the index dedup (``index_dedup``), of this process.
    Each call after the first (one-time setup: 1 more device-to-host copy and sync per kernel was seen
    there) adds its copies and syncs and one ``steps``. Returns the live totals (kernel -> ``steps``,
    ``h2d``, ``d2h``, ``syncs``, and ``tables``: the most tables one call serves): put them under the case's
    ``transfers`` key. Without the emulator: ``{}``, nothing
    wrapped. Use it where one thread trains (a pipeline's host threads would add their copies to the lookup's).

    Example::

        transfers = count_transfers(dmp)
        ...train...
        return {..., "transfers": transfers}
    """
    emulator = sys.modules.get("torchrec_ascend.testing.emulated_npu")
    if emulator is None or not emulator.is_installed():
        return {}
    from torchrec_ascend.kernels.fused import HashRows
    from torchrec_ascend.kernels.key_value.kernel import KeyValueRows
    from torchrec_ascend.kernels.walk import sharded_kernels
    from torchrec_ascend.sharders import index_dedup
    from torchrec_ascend.sharders.hash_row_wise import HashRwSparseFeaturesDist

    totals = _COUNTING["totals"] = {}

    def counted(name: str, fn: Callable[..., Any], tables: int = 1, method: bool = False) -> Callable[..., Any]:
        seen: Set[int] = set()

        def call(*args: Any, **kwargs: Any) -> Any:
            # A kernel's first call sets up fbgemm's views (one more copy and sync was seen there): not a step.
            owner = id(args[0]) if method else id(fn)
            if owner not in seen:
                seen.add(owner)
                return fn(*args, **kwargs)
            before = emulator.counters()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = emulator.counters() - before
                row = _COUNTING["totals"].setdefault(name, {**dict.fromkeys(TRANSFER_KEYS, 0), "tables": tables})
                row["steps"] += 1
                for key in TRANSFER_KEYS[1:]:
                    row[key] += getattr(spent, key)
        return call

    for kernel in (k for model in models for k in sharded_kernels(model)):
        if isinstance(kernel, HashRows):
            name = "key_value" if isinstance(kernel, KeyValueRows) else "fused_hash"
            kernel.forward = counted(name, kernel.forward, kernel.num_tables)
    # Input dists are made at a module's first forward: the class and the dedup function are wrapped, once.
    if not isinstance(index_dedup.dedup_per_table, functools.partial):
        index_dedup.dedup_per_table = functools.partial(counted("index_dedup", index_dedup.dedup_per_table))
        HashRwSparseFeaturesDist.forward = counted("row_wise_input_dist", HashRwSparseFeaturesDist.forward,
                                                   method=True)
    return totals


TRANSFER_KEYS = ("steps", "h2d", "d2h", "syncs")
_COUNTING: Dict[str, Dict[str, Dict[str, int]]] = {"totals": {}}  # where the wrappers count: the latest case's


def merge(gathered: List[Dict[str, Any]], worst: Sequence[str], totals: Sequence[str]) -> Dict[str, Any]:
    """One result from every rank's: errors joined, ``worst`` keys maxed, ``totals`` summed, ``residency`` joined,
    ``transfers`` summed per kernel, the rest rank 0's (a ``worst`` key no rank reports stays absent)."""
    merged = dict(gathered[0])
    merged["error"] = "; ".join(sorted({g["error"] for g in gathered if g["error"]}))
    merged["traceback"] = next((g.get("traceback", "") for g in gathered if g["error"]), "")
    for key in worst:
        values = [g[key] for g in gathered if g.get(key) is not None]
        if values:
            merged[key] = max(values)
    for key in totals:
        merged[key] = sum(g.get(key) or 0 for g in gathered)
    counts = [g["transfers"] for g in gathered if g.get("transfers")]
    if counts:  # summed over ranks, per kernel
        merged["transfers"] = {
            kernel: {**{key: sum(c.get(kernel, {}).get(key, 0) for c in counts) for key in TRANSFER_KEYS},
                     "tables": max(c.get(kernel, {}).get("tables", 0) for c in counts)}
            for kernel in sorted(set().union(*counts))
        }
    where = [g["residency"] for g in gathered if g.get("residency")]
    if where:
        merged["residency"] = {part: sorted(set().union(*(w.get(part, ()) for w in where))) for part in where[0]}
    return merged


def start_rank(description: str) -> Tuple[argparse.Namespace, Any]:
    """Parse a script's ``--cases`` / ``--out``, give the rank one thread, join the default process group (with a
    timeout: a rank that fails mid-case must not hang the others in a collective)."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--cases", required=True, help="JSON list of case objects")
    parser.add_argument("--out", required=True, help="where rank 0 writes the JSON results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(process_group_backend(), timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return args, dist.group.WORLD


def main(
    description: str,
    run_case: Callable[[Dict[str, Any], Any], Dict[str, Any]],
    worst: Sequence[str] = (),
    totals: Sequence[str] = (),
) -> NoReturn:
    """Run every ``--cases`` case with ``run_case`` on this rank, let rank 0 write the merged results, exit."""
    args, pg = start_rank(description)
    results = []
    for case in json.loads(args.cases):
        try:
            result = {**case, **run_case(case, pg), "error": ""}
        except Exception as err:
            traceback.print_exc()
            result = {**case, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        gathered: List[Any] = [None] * pg.size()
        dist.all_gather_object(gathered, result, group=pg)
        results.append(merge(gathered, worst, totals))
        gc.collect()  # free the case's sharded modules (and their threads) while the group is alive
    if dist.get_rank() == 0:
        info = {"world_size": pg.size(), "device": script_device().type, "backend": dist.get_backend(pg)}
        with open(args.out, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=1)
    dist.barrier()  # no rank tears down its connections while another still talks to it
    end_rank()

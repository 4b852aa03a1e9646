"""The suite's scripts' shared ``main()``: one process group, many cases, results merged over ranks (stock-only).

A script defines ``run_case(case, pg) -> dict`` and calls :func:`main`. Each case runs on every rank; an exception
is printed at once (the other ranks may be left waiting in a collective, so the group has a timeout) and reported per
case. Rank 0 writes ``{"info": {...}, "results": [...]}`` to ``--out``, as ``launch.run_distributed`` expects, with
the device the ranks ran on (``info["device"]``, from :func:`device_env.script_device`).

A case that trains reports where its tensors lived with :func:`residency` (the ``residency`` key: the device types
of the model's parameters, its optimizer state, its inputs and its outputs, over all ranks); the suite fails a case
whose tensors lived anywhere but the device under test.

This module imports only torch and torchrec, so the stock scripts beside it (which never import torchrec_ascend)
run through it too; the plugin's scripts reach it through ``plugin/runner.py``.

Example::

    if __name__ == "__main__":
        main(__doc__, run_case, worst=("fwd_err",), totals=("evicted",))
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import traceback
from typing import Any, Callable, Dict, List, NoReturn, Sequence, Set, Tuple

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

if __package__:  # imported through the suite's package
    from . import device_env
else:  # imported by a stock script run as a script: this folder is sys.path[0]
    import device_env  # type: ignore[import-not-found,no-redef]  # found as a script

#: Seconds a rank waits in a collective for a rank that failed (``TORCHREC_ASCEND_COLLECTIVE_TIMEOUT_S`` sets it: the
#: suite's own tests of runs that must fail set less, so they do not wait the whole default).
COLLECTIVE_TIMEOUT_S = int(os.environ.get("TORCHREC_ASCEND_COLLECTIVE_TIMEOUT_S", "120"))
TRANSFER_KEYS = ("steps", "h2d", "d2h", "syncs")


def devices_of(obj: Any) -> Set[str]:
    """The device types of every tensor in ``obj``: a tensor, a ShardedTensor, a TorchRec jagged or keyed tensor, a
    module (its parameters: buffers such as the hash tables' ID maps live on the host by design), an optimizer (its
    state), or dicts, lists and tuples of these. A tensor of no elements holds nothing and counts nowhere (stock
    TorchRec keeps ``torch.empty(0)`` host placeholders for the tables a rank does not hold), nor does one without
    storage (a view read on demand, such as a window over a KEY_VALUE table's rows kept in its tiers).

    Example::

        devices_of({"w": torch.zeros(2), "out": [torch.ones(1)], "none": torch.empty(0)})   # {'cpu'}
    """
    if hasattr(obj, "local_shards"):  # ShardedTensor (a tensor subclass: asked first)
        return set().union(*(devices_of(s.tensor) for s in obj.local_shards()))
    if isinstance(obj, torch.Tensor):
        return {obj.device.type} if obj.numel() and obj.untyped_storage().nbytes() else set()
    if isinstance(obj, (JaggedTensor, KeyedJaggedTensor, KeyedTensor)):
        return devices_of(obj.values())
    if isinstance(obj, torch.nn.Module):
        return devices_of(list(obj.parameters()))
    if isinstance(obj, torch.optim.Optimizer):  # a non-fused torch optimizer keeps its "step" counter on the host
        return devices_of([{k: v for k, v in s.items() if k != "step"} if isinstance(s, dict) else s
                           for s in obj.state.values()])
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
    dist.init_process_group(device_env.process_group_backend(),
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return args, dist.group.WORLD


def main(
    description: str,
    run_case: Callable[[Dict[str, Any], Any], Dict[str, Any]],
    worst: Sequence[str] = (),
    totals: Sequence[str] = (),
    info: Callable[[], Dict[str, Any]] = dict,
) -> NoReturn:
    """Run every ``--cases`` case with ``run_case`` on this rank, let rank 0 write the merged results, exit.

    Args:
        info: more entries for the results' ``info`` (called on rank 0 after the last case).
    """
    args, pg = start_rank(description)
    results = []
    for case in json.loads(args.cases):
        try:
            result = {**case, **run_case(case, pg), "error": ""}
        except Exception as err:  # reported per case, so one failure does not hide the others
            traceback.print_exc()
            result = {**case, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        gathered: List[Any] = [None] * pg.size()
        dist.all_gather_object(gathered, result, group=pg)
        results.append(merge(gathered, worst, totals))
        gc.collect()  # free the case's sharded modules (and their threads) while the group is alive
    if dist.get_rank() == 0:
        written = {"world_size": pg.size(), "device": device_env.script_device().type,
                   "backend": dist.get_backend(pg), **info()}
        with open(args.out, "w") as f:
            json.dump({"info": written, "results": results}, f, indent=1)
    dist.barrier()  # no rank tears down its connections while another still talks to it
    # As torchrec_ascend.shutdown.end_rank (not importable here): with gloo, finalization with torch's communication
    # threads alive can abort the process after the work is done, so end without it.
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

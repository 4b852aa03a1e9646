"""The shared ``main()`` of the plugin scripts: one process group, many cases, results merged over ranks.

A script defines ``run_case(case, pg) -> dict`` and calls :func:`main`. Each case runs on every rank; an exception
is printed at once (the other ranks may be left waiting in a collective, so the group has a timeout) and reported per
case. Rank 0 writes ``{"info": {...}, "results": [...]}`` to ``--out``, as :func:`launch.run_distributed` expects.

Example::

    if __name__ == "__main__":
        main(__doc__, run_case, worst=("fwd_err",), totals=("evicted",))
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import traceback
from typing import Any, Callable, Dict, List, NoReturn, Sequence, Tuple

import torch
import torch.distributed as dist

from torchrec_ascend.conformance_tests.launch import process_group_backend, script_device
from torchrec_ascend.shutdown import end_rank

COLLECTIVE_TIMEOUT_S = 120


def merge(gathered: List[Dict[str, Any]], worst: Sequence[str], totals: Sequence[str]) -> Dict[str, Any]:
    """One result from every rank's: errors joined, ``worst`` keys maxed, ``totals`` summed, the rest rank 0's."""
    merged = dict(gathered[0])
    merged["error"] = "; ".join(sorted({g["error"] for g in gathered if g["error"]}))
    merged["traceback"] = next((g.get("traceback", "") for g in gathered if g["error"]), "")
    for key in worst:
        values = [g[key] for g in gathered if g.get(key) is not None]
        merged[key] = max(values) if values else None
    for key in totals:
        merged[key] = sum(g.get(key) or 0 for g in gathered)
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

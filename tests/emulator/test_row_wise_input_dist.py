"""The hash row-wise input dist (torchrec_ascend.sharders.hash_row_wise) on 2 emulated-NPU ranks: its copies.

Oracle: exact copy counts derived from what one call moves, and the same input dist on the CPU (gloo) for what
each rank receives. The dist's own part is one device-to-host copy (lengths, IDs and weights packed; blocking, so
the one host sync) and one host-to-device copy (bucketed lengths, IDs, permutation and weights packed), whatever
the batch carries; TorchRec's all-to-all inside it adds its splits down and one tensor up per tensor it sends
(lengths, IDs, weights, and for a variable batch size per feature the strides).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Dict

import pytest

from fresh_interpreter import report, run_python

HERE = Path(__file__).resolve().parent
KINDS = ("plain", "weighted", "vbe")


def _batch(kind: str, rank: int) -> Any:
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys, values = ["f1", "f2"], torch.tensor([1, 2, 3, 4, 25, 0]) + rank
    if kind == "vbe":  # feature f2 has one sample fewer on rank 1, as the conformance suite's vbe variant
        samples = [2, 2 - rank]
        lengths = torch.tensor([2, 1, 2, 1][: sum(samples)])
        values = values[: int(lengths.sum())]
        inverse = torch.stack([torch.arange(2) % b for b in samples])
        return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths,
                                 stride_per_key_per_rank=[[b] for b in samples], inverse_indices=(keys, inverse))
    weights = torch.arange(6, dtype=torch.float32) / 8 if kind == "weighted" else None
    return KeyedJaggedTensor(keys=keys, values=values, lengths=torch.tensor([2, 1, 2, 1]), weights=weights)


def _rank(rank: int, store_file: str, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    from torchrec_ascend.testing import emulated_npu

    emulated_npu.install()
    torch.npu.set_device(rank)
    dist.init_process_group("cpu:gloo,npu:hccl", store=dist.FileStore(store_file, 2), rank=rank, world_size=2)
    from torchrec_ascend.adapters import sharding as adapter
    from torchrec_ascend.sharders.hash_row_wise import HashRwSparseFeaturesDist

    send, spent = adapter.send, {}

    def counted_send(input_dist: Any, bucketized: Any) -> Any:
        with emulated_npu.measure() as step:
            out = send(input_dist, bucketized)
        spent["torchrec"] = dataclasses.asdict(step.counts)
        return out

    adapter.send = counted_send
    npu, cpu = torch.device("npu", rank), torch.device("cpu")
    table_of = {"f1": "t1", "f2": "t2"}
    dists = {d: HashRwSparseFeaturesDist(dist.GroupMember.WORLD, table_of, False, d) for d in (npu, cpu)}
    facts: Dict[str, Any] = {}
    for kind in KINDS:
        received = {}
        for device, input_dist in dists.items():
            for _ in range(2):  # the second call is the one counted (the first sets up TorchRec's buffers)
                batch = _batch(kind, rank).to(device)
                with emulated_npu.measure() as call:
                    awaitable = input_dist(batch)
                kjt = awaitable.wait().wait()
            received[device.type] = [kjt.lengths().cpu(), kjt.values().cpu(), kjt.weights_or_none()]
            if device.type == "npu":
                total = dataclasses.asdict(call.counts)
                own = {k: total[k] - spent["torchrec"][k] for k in total}
                facts[kind] = {"total": total, "own": own, "device": str(kjt.values().device)}
        facts[kind]["equal"] = all(
            (a is None and b is None) or torch.equal(a.cpu(), b.cpu())
            for a, b in zip(received["npu"], received["cpu"])
        )
    dist.destroy_process_group()
    queue.put((rank, facts))
    os._exit(0)


def child() -> None:
    """Two forked ranks; report each rank's facts."""
    import multiprocessing as mp
    import tempfile

    store_file = os.path.join(tempfile.mkdtemp(), "store")
    context = mp.get_context("fork")
    queue = context.SimpleQueue()
    ranks = [context.Process(target=_rank, args=(r, store_file, queue)) for r in range(2)]
    for p in ranks:
        p.start()
    results = dict(queue.get() for _ in ranks)
    for p in ranks:
        p.join(60)
    report({"ranks": {str(r): f for r, f in results.items()}, "exit": [p.exitcode for p in ranks]})


@pytest.fixture(scope="module")
def ranks() -> Dict[str, Any]:
    paths = os.pathsep.join([str(HERE.parent / "foundation"), str(HERE)])
    facts = run_python("from test_row_wise_input_dist import child; child()", env={"PYTHONPATH": paths}, timeout=300)
    assert facts["exit"] == [0, 0]
    return facts["ranks"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_dist_copies_once_each_way_whatever_the_batch_carries(ranks: Dict[str, Any], kind: str) -> None:
    for facts in ranks.values():
        own = facts[kind]["own"]
        assert (own["d2h"], own["syncs"], own["h2d"], own["d2d"]) == (1, 1, 1, 0), own


# Rank 0's whole call. Down: lengths (4 x 8 bytes), IDs (6 x 8) and weights (6 x 4) in one copy, TorchRec's splits
# (32 bytes). Up: bucketed lengths (8 x 8), IDs and permutation (6 x 8 each) and weights in one copy, and one
# TorchRec tensor per tensor it sends (3 plain, 4 with weights, 5 with variable strides).
@pytest.mark.parametrize("kind, d2h_bytes, h2d", [("plain", 80 + 32, 4), ("weighted", 104 + 32, 5),
                                                  ("vbe", 32 + 48 + 32, 6)])
def test_one_call_on_rank_0(ranks: Dict[str, Any], kind: str, d2h_bytes: int, h2d: int) -> None:
    total = ranks["0"][kind]["total"]
    assert (total["d2h"], total["syncs"], total["d2h_bytes"], total["h2d"]) == (2, 2, d2h_bytes, h2d)


@pytest.mark.parametrize("kind", KINDS)
def test_each_rank_receives_what_the_cpu_dist_delivers(ranks: Dict[str, Any], kind: str) -> None:
    for facts in ranks.values():
        assert facts[kind]["equal"] is True
        assert facts[kind]["device"].startswith("npu")

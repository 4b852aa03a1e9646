"""The plugin scripts' runner: the suite's shared case loop (``stock/case_loop.py``) and the emulated NPU's
per-kernel copy and sync counting.

A script defines ``run_case(case, pg) -> dict`` and calls :func:`main` (see ``stock/case_loop.py``: one process
group, many cases, results merged over ranks; the stock scripts use the same loop without importing this package).
A case that trains reports where its tensors lived with :func:`residency`, and on the emulated NPU what its
per-batch parts copied and synced with :func:`count_transfers`.

Example::

    if __name__ == "__main__":
        main(__doc__, run_case, worst=("fwd_err",), totals=("evicted",))
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
import tempfile
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Set

import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import get_default_hybrid_sharders
from torchrec_ascend.conformance_tests.launch import script_device
from torchrec_ascend.conformance_tests.stock.case_loop import (  # noqa: F401  (the scripts' API, re-exported)
    TRANSFER_KEYS,
    devices_of,
    main,
    merge,
    residency,
    start_rank,
)


def planned(module: torch.nn.Module, constraints: Dict[str, Any], pg: Any,
            sharders: Optional[List[Any]] = None) -> DistributedModelParallel:
    """``module`` planned by TorchRec's planner under ``constraints`` (table -> ParameterConstraints) for ``pg``'s
    ranks, and sharded by DistributedModelParallel on the suite's device (the default hybrid sharders unless given).

    Example::

        dmp = planned(ebc, {"user": ParameterConstraints(sharding_types=["row_wise"])}, pg)
    """
    device = script_device()
    sharders = sharders or get_default_hybrid_sharders()
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=pg.size(), compute_device=device.type),
                                       constraints=constraints)
    return DistributedModelParallel(module, env=ShardingEnv.from_process_group(pg), device=device,
                                    plan=planner.plan(module, sharders), sharders=sharders)


def key_value_options(kernel: str, load_factor: float, host_mb: float, directory: str) -> Dict[str, Any]:
    """A table's ParameterConstraints options for ``kernel``: for ``key_value`` a device cache of ``load_factor`` of
    the shard and ``host_mb`` MB of host memory over a disk tier in ``directory``; none for ``fused``.

    Example::

        ParameterConstraints(compute_kernels=["key_value"], **key_value_options("key_value", 0.5, 1 / 1024, disk))
    """
    if kernel != "key_value":
        return {}
    return {"cache_params": CacheParams(load_factor=load_factor),
            "key_value_params": KeyValueParams(l2_cache_size=host_mb / 1024, ssd_storage_directory=directory)}


@contextlib.contextmanager
def shared_directory(prefix: str, pg: Any) -> Iterator[str]:
    """A fresh directory that every rank of ``pg`` sees (rank 0 makes it), removed when the case is done.

    A case's checkpoints hold the disk tier's segments (~200 MB): a suite run must not leave them behind.

    Example::

        with shared_directory("ckpt-", pg) as directory:
            Saver(process_group=pg).save(model, directory)
    """
    box: List[Any] = [tempfile.mkdtemp(prefix=prefix) if pg.rank() == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(pg, 0), group=pg)
    directory: str = box[0]
    try:
        yield directory
        dist.barrier(group=pg)  # no rank still reads it
    finally:
        if pg.rank() == 0:
            shutil.rmtree(directory, ignore_errors=True)


def first_ranks(world: Any, size: int) -> Optional[Any]:
    """The first ``size`` ranks of ``world`` as a process group (None on the other ranks); every rank must call it."""
    if size == world.size():
        return world
    group = dist.new_group(ranks=list(range(size)))
    return group if world.rank() < size else None


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
                part = name + ("_vbe" if _variable_batch(args, kwargs) else "")  # fbgemm's VBE adds its copies
                row = _COUNTING["totals"].setdefault(part, {**dict.fromkeys(TRANSFER_KEYS, 0), "tables": tables})
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
        HashRwSparseFeaturesDist.forward = counted(  # type: ignore[method-assign]  # counting wrapper, test runs only
            "row_wise_input_dist", HashRwSparseFeaturesDist.forward, method=True
        )
    return totals


@contextlib.contextmanager
def counted_on_this_thread(part: str, transfers: Dict[str, Dict[str, int]]) -> Iterator[None]:
    """On the emulated NPU, add this thread's copies and host syncs in the block to ``transfers[part]`` as one
    step (a block that raises adds nothing); elsewhere nothing. Other threads' work (a pipeline's lanes) is left out.

    Example::

        with counted_on_this_thread("key_value_pipeline_compute_thread", transfers):
            pipeline.progress(batches)
    """
    emulator = sys.modules.get("torchrec_ascend.testing.emulated_npu")
    if emulator is None or not emulator.is_installed():
        yield
        return
    with emulator.measure() as block:
        yield
    spent = block.threads.get(threading.get_native_id(), emulator.Counts())
    row = transfers.setdefault(part, {**dict.fromkeys(TRANSFER_KEYS, 0), "tables": 1})
    row["steps"] += 1
    for key in TRANSFER_KEYS[1:]:
        row[key] += getattr(spent, key)


def _variable_batch(args: Any, kwargs: Any) -> bool:
    """A call on a variable-batch (VBE) KeyedJaggedTensor."""
    return any(isinstance(a, KeyedJaggedTensor) and a.variable_stride_per_key() for a in (*args, *kwargs.values()))


_COUNTING: Dict[str, Dict[str, Dict[str, int]]] = {"totals": {}}  # where the wrappers count: the latest case's

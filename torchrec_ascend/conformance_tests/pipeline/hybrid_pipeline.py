"""HybridTrainPipelineSparseDist vs. a plain training loop on the same DMP, one process group, many cases.

The oracle is the plain loop ``zero_grad; (losses, _) = dmp(batch); losses.sum().backward(); step`` on a
DistributedModelParallel built the same way, from the same initial weights, fed the same batches: after training,
every embedding shard and dense parameter of the pipelined model must equal the plain loop's. Run with torchrun::

    torchrun --standalone --nproc-per-node 2 hybrid_pipeline.py --cases '[{"kind": "equivalence", ...}]' --out r.json

Case kinds (JSON objects; ``model`` is ``ebc``, ``ec`` or ``both``, ``sharding_type`` ``row_wise`` or ``table_wise``):

* ``equivalence`` (``model``, ``sharding_type``, ``depth``, ``batches``, ``host_threads``, optionally
  ``"dedup": "index_dedup"``: the pipelined model's EmbeddingCollection dedups its IDs before the all-to-all, the
  oracle's does not): train ``batches`` batches at depth ``depth``; report ``weight_err``, ``output_err``
  (per-step outputs), ``moved``, ``steps``, ``index_dedup``.
* ``end_of_data`` (``depth``, ``batches``, ``execute_all_batches``): as above on short data; ``steps`` counts the
  batches trained and the oracle trains the same ones.
* ``raise`` (``where``: ``load``/``copy``/``split``/``prefetch``/``compute``, ``at``, ``depth``): that stage raises
  on batch ``at`` on every rank; report ``steps`` before the error, its ``stage``/``batch_index``/``message``, and
  ``resumed`` (steps trained after calling ``progress`` again).
* ``detach`` (``depth``, ``batches``, ``detach_at``): detach mid-run, run the original model's forward, then resume;
  the final weights must still equal the plain loop over all batches.
* ``collect`` (``depth``): drop a pipeline with batches in flight; report the pipeline threads and mirror groups
  left after garbage collection.

Training cases also report ``mirrors`` (groups the pipeline created) and ``input_dists_on_mirrors`` (every
pipelined input dist issues its all-to-alls there, never on the model's group).

Every case also reports ``threads_left``: pipeline threads alive after its pipeline stopped; training cases report
``residency`` (where the pipelined model's parameters, optimizer state, batches and outputs lived: the suite's
device, ``launch.script_device()``). Rank 0 writes one result per case (``plugin/runner.py``); errors and thread
counts are the worst over ranks.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from torchrec_ascend import get_default_hybrid_sharders
from torchrec_ascend.conformance_tests.launch import script_device
from torchrec_ascend.conformance_tests.plugin.runner import main, residency
from torchrec_ascend.pipeline import HybridTrainPipelineSparseDist, PipelineStageError

POOLED_TABLES = [("t0", 64, 8), ("t1", 96, 8)]  # name, rows, dim
SEQUENCE_TABLES = [("s0", 80, 8)]
BATCH, MAX_LEN, DENSE, LR = 8, 4, 4, 0.1
THREAD_PREFIX = "hybrid-pipeline"


@dataclasses.dataclass
class HybridBatch(Pipelineable):
    """Dense features, pooled and sequence KJTs, labels; ``poison`` makes ``to()`` raise (the COPY2DEVICE case)."""

    dense: torch.Tensor
    pooled: KeyedJaggedTensor
    sequence: KeyedJaggedTensor
    labels: torch.Tensor
    poison: bool = False

    def to(self, device: torch.device, non_blocking: bool = False) -> "HybridBatch":
        if self.poison:
            raise ValueError("poisoned batch cannot be copied")
        return HybridBatch(
            self.dense.to(device, non_blocking=non_blocking),
            self.pooled.to(device, non_blocking=non_blocking),
            self.sequence.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
        )

    def record_stream(self, stream: torch.Stream) -> None:
        for part in (self.dense, self.pooled, self.sequence, self.labels):
            part.record_stream(stream)


def _collection(cls: Any, config_cls: Any, tables: List[Tuple[str, int, int]]) -> Any:
    """A stock collection of ``tables`` (name, rows, dim), feature ``f_<name>`` each, on the CPU."""
    configs = [config_cls(name=n, num_embeddings=r, embedding_dim=d, feature_names=[f"f_{n}"]) for n, r, d in tables]
    return cls(tables=configs, device=torch.device("cpu"))


class Model(torch.nn.Module):
    """Dense features plus pooled (EBC) and/or sequence (EC) embeddings -> BCE and a sequence regulariser."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.ebc = _collection(torchrec.EmbeddingBagCollection, torchrec.EmbeddingBagConfig, POOLED_TABLES) \
            if kind in ("ebc", "both") else None
        self.ec = _collection(torchrec.EmbeddingCollection, torchrec.EmbeddingConfig, SEQUENCE_TABLES) \
            if kind in ("ec", "both") else None
        pooled_dim = sum(d for _, _, d in POOLED_TABLES) if self.ebc is not None else 0
        self.head = torch.nn.Linear(DENSE + pooled_dim, 1)
        self.sequence_head = torch.nn.Linear(SEQUENCE_TABLES[0][2], 1)

    def forward(self, batch: HybridBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        features = [batch.dense]
        if self.ebc is not None:
            features.append(self.ebc(batch.pooled).values())
        logits = self.head(torch.cat(features, dim=1)).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        if self.ec is not None:
            sequences = self.ec(batch.sequence)
            for name, _, _ in SEQUENCE_TABLES:
                loss = loss + torch.tanh(self.sequence_head(sequences[f"f_{name}"].values())).pow(2).mean()
        return loss, logits


def random_kjt(tables: List[Tuple[str, int, int]], gen: torch.Generator) -> KeyedJaggedTensor:
    lengths = torch.randint(0, MAX_LEN + 1, (len(tables) * BATCH,), generator=gen)
    values = torch.cat(
        [torch.randint(0, rows, (int(lengths[i * BATCH:(i + 1) * BATCH].sum()),), generator=gen)
         for i, (_, rows, _) in enumerate(tables)]
    )
    return KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{n}" for n, _, _ in tables], values=values, lengths=lengths)


def make_batch(step: int, rank: int) -> HybridBatch:
    gen = torch.Generator().manual_seed(7919 * step + rank)
    return HybridBatch(
        dense=torch.randn(BATCH, DENSE, generator=gen),
        pooled=random_kjt(POOLED_TABLES, gen),
        sequence=random_kjt(SEQUENCE_TABLES, gen),
        labels=torch.randint(0, 2, (BATCH,), generator=gen).float(),
    )


def shard(
    kind: str, sharding_type: str, pg: dist.ProcessGroup, initial: Dict[str, torch.Tensor], dedup: bool = False
) -> Tuple[Any, Any]:
    """A DMP of ``Model(kind)`` with the initial weights and a dense optimizer (tables train fused in backward)."""
    torch.manual_seed(0)
    model = Model(kind)
    for sparse in (model.ebc, model.ec):
        if sparse is not None:
            apply_optimizer_in_backward(torch.optim.SGD, sparse.parameters(), {"lr": LR})
    constraints = {
        n: ParameterConstraints(sharding_types=[sharding_type], compute_kernels=["fused"])
        for n, _, _ in POOLED_TABLES + SEQUENCE_TABLES
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=pg.size(), compute_device=script_device().type), constraints=constraints
    )
    sharders = get_default_hybrid_sharders(use_index_dedup=True) if dedup else get_default_sharders()
    plan = planner.plan(model, sharders)  # every rank plans the same plan (no collective_plan: see sharding_matrix)
    dmp = DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(pg), device=script_device(), plan=plan, sharders=sharders
    )
    with torch.no_grad():  # DMP re-initialises tables at sharding: write the shared initial weights back
        for name, value in dmp.state_dict().items():
            full = initial[name[len("module."):] if name.startswith("module.") else name]
            for local, offsets in local_pieces(value):
                local.copy_(full[tuple(slice(o, o + s) for o, s in zip(offsets, local.shape))])
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda ps: torch.optim.SGD(ps, lr=LR)
    )
    return dmp, dense


def local_pieces(value: Any) -> List[Tuple[torch.Tensor, List[int]]]:
    """This rank's pieces of a state-dict value with their offsets in the full tensor."""
    if hasattr(value, "local_shards"):
        return [(s.tensor, list(s.metadata.shard_offsets)) for s in value.local_shards()]
    return [(value, [0] * value.dim())]


def state_of(dmp: Any) -> Dict[str, List[torch.Tensor]]:
    return {name: [t.detach().clone() for t, _ in local_pieces(v)] for name, v in dmp.state_dict().items()}


def max_diff(a: Dict[str, List[torch.Tensor]], b: Dict[str, List[torch.Tensor]]) -> float:
    assert a.keys() == b.keys()
    return max((x - y).abs().max().item() for k in a for x, y in zip(a[k], b[k]) if x.numel())


def plain_outputs(dmp: Any, dense: Any, batches: List[HybridBatch]) -> List[torch.Tensor]:
    """The oracle: a plain training loop; returns each step's output (logits)."""
    outputs = []
    for batch in batches:
        dense.zero_grad()
        loss, logits = dmp(batch.to(script_device()))
        torch.sum(loss, dim=0).backward()
        dense.step()
        outputs.append(logits.detach().clone())
    return outputs


def drain(pipeline: HybridTrainPipelineSparseDist, batches: Iterator[Any], limit: int = 1000) -> int:
    """Call progress until StopIteration; returns how many batches it trained."""
    for steps in range(limit):
        try:
            pipeline.progress(batches)
        except StopIteration:
            return steps
    raise AssertionError(f"progress did not stop after {limit} steps")


class _Reference:
    """Plain-loop results, cached per (model, sharding type, number of batches) across cases."""

    def __init__(self, pg: dist.ProcessGroup) -> None:
        self._pg = pg
        self._cache: Dict[Tuple[str, str, int], Tuple[Dict[str, Any], Dict[str, Any], List[torch.Tensor]]] = {}
        torch.manual_seed(0)
        self.initial = {kind: Model(kind).state_dict() for kind in ("ebc", "ec", "both")}

    def get(self, kind: str, sharding_type: str, n: int) -> Tuple[Dict[str, Any], Dict[str, Any], List[torch.Tensor]]:
        """Initial state, final state and per-step outputs of the plain loop over the first ``n`` batches."""
        key = (kind, sharding_type, n)
        if key not in self._cache:
            dmp, dense = shard(kind, sharding_type, self._pg, self.initial[kind])
            start = state_of(dmp)
            outputs = plain_outputs(dmp, dense, [make_batch(s, self._pg.rank()) for s in range(n)])
            self._cache[key] = (start, state_of(dmp), outputs)
        return self._cache[key]


def input_dists_on_mirrors(dmp: Any, mirrors: List[dist.ProcessGroup]) -> bool:
    """Whether every pipelined input dist of ``dmp`` issues its all-to-alls on one of the pipeline's mirror groups."""
    forwards = [
        input_dist._dist.forward
        for module in dmp.modules()
        for input_dist in getattr(module, "_input_dists", None) or []
        if hasattr(input_dist, "_dist")
    ]
    return bool(forwards) and all(getattr(f, "_pg", None) in mirrors for f in forwards)


def pipeline_threads() -> int:
    return sum(t.name.startswith(THREAD_PREFIX) for t in threading.enumerate())


def run_training(case: Dict[str, Any], ref: _Reference, pg: dist.ProcessGroup) -> Dict[str, Any]:
    kind, sharding_type = case.get("model", "both"), case.get("sharding_type", "row_wise")
    n, rank = case["batches"], pg.rank()
    execute_all = case.get("execute_all_batches", True)
    dmp, dense = shard(kind, sharding_type, pg, ref.initial[kind], case.get("dedup") == "index_dedup")
    pipeline = HybridTrainPipelineSparseDist(
        dmp, dense, script_device(), pipe_n_batch=case["depth"], host_threads=case.get("host_threads", 2),
        execute_all_batches=execute_all,
    )
    outputs: List[torch.Tensor] = []
    batches = iter([make_batch(s, rank) for s in range(n)])
    detach_at = case.get("detach_at")
    while True:
        if detach_at is not None and len(outputs) == detach_at:
            model = pipeline.detach()
            detached_threads = pipeline_threads()
            with torch.no_grad():
                model(make_batch(999, rank).to(script_device()))  # the original forward works while detached
            detach_at = None
        try:
            outputs.append(pipeline.progress(batches).detach().clone())
        except StopIteration:
            break
    trained = len(outputs)
    start, final, ref_outputs = ref.get(kind, sharding_type, trained)
    result = {
        "steps": trained,
        "weight_err": max_diff(state_of(dmp), final),
        "output_err": max(((a - b).abs().max().item() for a, b in zip(outputs, ref_outputs)), default=0.0),
        "moved": max_diff(final, start) if trained else 0.0,
        "threads_left": pipeline_threads(),
        "mirrors": len(pipeline._resources.groups.groups()),
        "input_dists_on_mirrors": input_dists_on_mirrors(dmp, pipeline._resources.groups.groups()),
        "index_dedup": any(getattr(m, "_use_index_dedup", False) for m in dmp.modules()),
        "residency": residency(parameters=dmp, optimizer=[dmp.fused_optimizer, dense], inputs=[], outputs=outputs),
    }
    if case.get("detach_at") is not None:
        result["detached_threads"] = detached_threads
    return result


def run_raise(case: Dict[str, Any], ref: _Reference, pg: dist.ProcessGroup) -> Dict[str, Any]:
    where, at, rank = case["where"], case["at"], pg.rank()
    dmp, dense = shard("both", "row_wise", pg, ref.initial["both"])
    data = [make_batch(s, rank) for s in range(at + case["depth"] + 4)]  # some are left to resume with

    def raising_source() -> Iterator[HybridBatch]:
        for step, batch in enumerate(data):
            if where == "load" and step == at:
                raise ValueError(f"dataloader broke at batch {step}")
            yield dataclasses.replace(batch, poison=where == "copy" and step == at)

    sharded = dmp.module.ebc
    if where == "split":
        sharded.input_dist = fail_on_call(sharded.input_dist, at, "input_dist")
    if where == "prefetch":
        sharded.prefetch = fail_on_call(sharded.prefetch, at, "prefetch")
    if where == "compute":
        dmp.module.head.forward = fail_on_call(dmp.module.head.forward, at, "head", skip=torch.fx.Proxy)
    pipeline = HybridTrainPipelineSparseDist(dmp, dense, script_device(), pipe_n_batch=case["depth"])
    batches, steps, error = raising_source(), 0, None
    while error is None:
        try:
            pipeline.progress(batches)
            steps += 1
        except PipelineStageError as err:
            error = err
        except StopIteration:
            break
    threads_after_error = pipeline_threads()
    # Go on: a failed dataloader is replaced; other failures continue on the same iterator.
    resume = iter(data[at + 1:]) if where in ("load", "copy") else batches
    resumed = drain(pipeline, resume)
    return {
        "steps": steps,
        "stage": error.stage.value if error else None,
        "batch_index": error.batch_index if error else None,
        "message": str(error) if error else "",
        "cause": type(error.__cause__).__name__ if error else None,
        "threads_after_error": threads_after_error,
        "resumed": resumed,
        "threads_left": pipeline_threads(),
    }


def fail_on_call(fn: Callable[..., Any], at: int, what: str, skip: Optional[type] = None) -> Callable[..., Any]:
    """``fn`` raising on its ``at``-th real call (counting from 0; calls with a ``skip`` argument are not counted)."""
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if skip is not None and any(isinstance(a, skip) for a in args):
            return fn(*args, **kwargs)
        calls[0] += 1
        if calls[0] - 1 == at:
            raise RuntimeError(f"{what} broke on call {at}")
        return fn(*args, **kwargs)

    return wrapper


def run_collect(case: Dict[str, Any], ref: _Reference, pg: dist.ProcessGroup) -> Dict[str, Any]:
    dmp, dense = shard("both", "row_wise", pg, ref.initial["both"])
    pipeline = HybridTrainPipelineSparseDist(dmp, dense, script_device(), pipe_n_batch=case["depth"])
    batches = iter([make_batch(s, pg.rank()) for s in range(20)])
    for _ in range(2):
        pipeline.progress(batches)
    running = pipeline_threads()
    groups = pipeline._resources.groups.groups()
    mirror_ranks = [dist.get_process_group_ranks(g) for g in groups]
    del pipeline
    gc.collect()
    alive = [g for g in groups if g in dist.distributed_c10d._world.pg_map]
    return {"running": running, "threads_left": pipeline_threads(), "mirrors": len(groups),
            "mirror_ranks": mirror_ranks, "mirrors_left": len(alive)}


@functools.lru_cache(maxsize=None)
def reference(pg: dist.ProcessGroup) -> _Reference:
    """The plain-loop results of this rank, shared by every case of the run."""
    return _Reference(pg)


def run_case(case: Dict[str, Any], pg: dist.ProcessGroup) -> Dict[str, Any]:
    run = {"raise": run_raise, "collect": run_collect}.get(case["kind"], run_training)
    return run(case, reference(pg), pg)


if __name__ == "__main__":
    main(__doc__, run_case, worst=("weight_err", "output_err", "threads_left", "threads_after_error", "mirrors_left"))

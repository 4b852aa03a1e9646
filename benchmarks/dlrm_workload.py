"""The shared workload of the 2-rank training benchmarks: a DLRM trained on Zipf IDs, variants timed interleaved.

``bench_hash_fused.py`` and ``bench_key_value.py`` compare compute kernels on the same model and the same data, so
both build it here, and run through :func:`run_benchmark`:

* model: TorchRec's own ``DLRM`` (dense MLP, one pooled EmbeddingBagCollection table per sparse feature, pairwise
  interaction, over MLP) wrapped in ``DLRMTrain`` (BCE loss); the tables' optimizer is RowWiseAdagrad fused into
  backward (FUSED and KEY_VALUE kernels), the dense one Adagrad.
* data: every rank draws a fixed pool of batches up front (never inside the timed loop) and cycles through it.
  Sparse features are Zipf(``alpha``)-distributed *keys* over a catalogue; a key becomes a stock row index through a
  fixed permutation of the table's rows (hot rows spread over every row-wise shard) or a raw 63-bit hash ID through
  ``mix64`` (what hash tables are for). Both views of one batch have the same reuse pattern.
* timing: all variants live at once and are timed in turns (one run of ``steps`` steps each, ``runs`` times), so
  the noise of this shared 2-core machine hits them alike; a run is barrier to barrier, so it is the time of the
  slowest rank; reported are medians over runs, and ratios are medians of the ratios within a round
  (:func:`paired_ratio`). This machine has 2 shared cores, one per rank: single runs vary by 2x and more when
  other jobs run, hence medians of interleaved runs.

Example::

    parser = argparse.ArgumentParser()
    add_workload_args(parser, rows=100_000)
    w = Workload.from_args(parser.parse_args())
    batches = make_batches(w, rank=0, raw_ids=True)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence

import torch
import torch.distributed as dist
import torchrec
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, ModuleSharder, ShardingEnv
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from results import write_result
from torchrec_ascend.conformance_tests.launch import run_distributed
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.key_value.kernel import KeyValueRows
from torchrec_ascend.kernels.walk import sharded_kernels
from torchrec_ascend.policies.hashing import mix64
from torchrec_ascend.shutdown import end_rank

EBC_PATH = "model.sparse_arch.embedding_bag_collection"  # where DMP finds the tables inside DLRMTrain
COLLECTIVE_TIMEOUT_S = 300
LR = 0.01


@dataclasses.dataclass(frozen=True)
class Workload:
    """Model and data sizes (per rank where it says so).

    Attributes:
        tables: sparse features, one table each.
        rows: rows per table (a hash table's capacity).
        dim: embedding dimension (also the dense MLP's output width, as DLRM requires).
        batch: samples per rank and step.
        bag: mean IDs per sample and feature (lengths uniform in ``[1, 2 * bag - 1]``).
        dense: dense input features.
        alpha: Zipf exponent of the keys.
        catalogue: distinct keys a feature can draw from.
        pool: batches per rank, cycled.
        seed: seed of the data and of the model's initial weights.
    """

    tables: int
    rows: int
    dim: int
    batch: int
    bag: int
    dense: int
    alpha: float
    catalogue: int
    pool: int
    seed: int = 0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Workload":
        """The workload named by the arguments of :func:`add_workload_args`."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def add_workload_args(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """Add the workload and timing arguments to ``parser``; ``defaults`` overrides the defaults by name."""
    values = dict(tables=4, rows=100_000, dim=16, batch=512, bag=8, dense=13, alpha=1.05, catalogue=50_000,
                  pool=40, seed=0, runs=5, steps=20, warmup=10, timeout=900)
    unknown = set(defaults) - set(values)
    if unknown:  # builtin: a benchmark's own code names a default that does not exist
        raise ValueError(f"add_workload_args: no argument named {sorted(unknown)}; known: {sorted(values)}")
    values.update(defaults)
    helps = dict(
        tables="sparse features, one table each",
        rows="rows per table (a hash table's capacity; see the docstring)",
        dim="embedding dimension", batch="samples per rank and step", bag="mean IDs per sample and feature",
        dense="dense input features", alpha="Zipf exponent of the keys", catalogue="distinct keys per feature",
        pool="batches per rank, drawn up front and cycled", seed="data and model seed",
        runs="timed runs per variant (medians over them)", steps="steps per timed run",
        warmup="untimed steps per variant first", timeout="seconds before the 2-rank launch is killed",
    )
    for name, value in values.items():
        parser.add_argument(f"--{name}", type=type(value), default=value, help=helps[name])
    parser.add_argument("--json", help="also write the results here, as JSON (what benchmarks/run_all.py reads)")
    parser.add_argument("--cases", help=argparse.SUPPRESS)  # set by the launcher: the settings, for the ranks
    parser.add_argument("--out", help=argparse.SUPPRESS)  # set by the launcher: where rank 0 writes its results


def zipf_cdf(catalogue: int, alpha: float) -> torch.Tensor:
    """Unnormalised float64 CDF ``[catalogue]`` of keys ``k`` with weight ``(k + 1) ** -alpha`` (Zipf)."""
    return torch.arange(1, catalogue + 1, dtype=torch.float64).pow(-alpha).cumsum(0)


def zipf_keys(count: int, cdf: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``count`` int64 keys in ``[0, len(cdf))`` drawn from the distribution of ``cdf`` (inverse transform)."""
    draws = torch.rand(count, dtype=torch.float64, generator=generator) * cdf[-1]
    return torch.searchsorted(cdf, draws).clamp_(max=cdf.numel() - 1)


def id_makers(w: Workload, raw_ids: bool) -> List[Callable[[torch.Tensor], torch.Tensor]]:
    """Per table, keys -> IDs: raw 63-bit hash IDs, or stock row indices spread over the table's rows.

    Raises:
        ConfigError: stock row indices asked for more keys than rows.
    """
    if raw_ids:
        return [functools.partial(mix64, seed=t) for t in range(w.tables)]
    if w.catalogue > w.rows:
        raise ConfigError(f"workload: catalogue {w.catalogue} > rows {w.rows}: stock row indices would not fit the "
                         "table. Lower --catalogue or raise --rows.")
    return [torch.randperm(w.rows, generator=torch.Generator().manual_seed(1000 * w.seed + t)).__getitem__
            for t in range(w.tables)]


def make_batches(w: Workload, rank: int, raw_ids: bool) -> List[Batch]:
    """The ``w.pool`` batches of ``rank``: dense features, jagged sparse IDs (feature-major), 0/1 labels."""
    gen = torch.Generator().manual_seed(7919 * w.seed + rank)
    cdf, to_ids = zipf_cdf(w.catalogue, w.alpha), id_makers(w, raw_ids)
    batches = []
    for _ in range(w.pool):
        lengths = torch.randint(1, 2 * w.bag, (w.tables, w.batch), generator=gen)
        per_table = [to_ids[t](zipf_keys(int(lengths[t].sum()), cdf, gen)) for t in range(w.tables)]
        batches.append(Batch(
            dense_features=torch.randn(w.batch, w.dense, generator=gen),
            sparse_features=KeyedJaggedTensor.from_lengths_sync(
                keys=feature_names(w), values=torch.cat(per_table), lengths=lengths.flatten()
            ),
            labels=torch.randint(0, 2, (w.batch,), generator=gen).float(),
        ))
    return batches


def feature_names(w: Workload) -> List[str]:
    return [f"f{t}" for t in range(w.tables)]


def table_names(w: Workload) -> List[str]:
    return [f"t{t}" for t in range(w.tables)]


def table_constraints(w: Workload, sharding_type: str, kernel: str = "fused",
                      load_factors: Optional[Sequence[float]] = None) -> Dict[str, ParameterConstraints]:
    """Every table of ``w`` on ``sharding_type`` and ``kernel``; ``load_factors``: each table's cache load factor.

    Example::

        table_constraints(w, "row_wise", "key_value", load_factors=[0.05] * w.tables)
    """
    factors: Sequence[Optional[float]] = [None] * w.tables if load_factors is None else load_factors
    return {t: ParameterConstraints(sharding_types=[sharding_type], compute_kernels=[kernel],
                                    cache_params=None if f is None else CacheParams(load_factor=f))
            for t, f in zip(table_names(w), factors)}


def build_dlrm(w: Workload, tables: Sequence[EmbeddingBagConfig]) -> DLRMTrain:
    """DLRMTrain over an EBC of ``tables`` (their optimizer, RowWiseAdagrad, fused into backward)."""
    torch.manual_seed(w.seed)  # same dense weights in every variant
    ebc = torchrec.EmbeddingBagCollection(tables=list(tables), device=torch.device("cpu"))
    apply_optimizer_in_backward(RowWiseAdagrad, [m.weight for m in ebc.embedding_bags.values()], {"lr": LR})
    dlrm = DLRM(embedding_bag_collection=ebc, dense_in_features=w.dense, dense_arch_layer_sizes=[64, w.dim],
                over_arch_layer_sizes=[64, 32, 1])
    return DLRMTrain(dlrm)


@dataclasses.dataclass
class Variant:
    """One sharded model under test, its batches and where it is in them."""

    name: str
    model: DistributedModelParallel
    optimizer: KeyedOptimizerWrapper
    batches: List[Batch]
    placement: Dict[str, List[int]]
    cursor: int = 0
    seconds: List[float] = dataclasses.field(default_factory=list)

    def step(self) -> None:
        """One training step: forward, backward (tables update inside it), dense optimizer step."""
        loss, _ = self.model(self.batches[self.cursor % len(self.batches)])
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.cursor += 1

    def run(self, steps: int) -> float:
        """Seconds for ``steps`` steps, barrier to barrier (the slowest rank's time)."""
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        dist.barrier()
        return time.perf_counter() - start


class MappingClock:
    """Seconds this rank's hash kernels of ``model`` spend choosing rows for a batch's IDs (every kernel's
    ``IdMapper.map_on_host``: the slot tables, their policies and, for KEY_VALUE, the swaps with the host store),
    the work a hash step does that a stock step does not; and, within it, the parts of a KEY_VALUE swap
    (:data:`SWAP_PARTS`).

    Example::

        clock = MappingClock(variant.model)
        variant.run(20)
        clock.seconds                  # of the 20 steps (and anything before)
        clock.parts["host store"]      # of which in the host stores' put and pop (KEY_VALUE kernels)
    """

    # Per part of a KEY_VALUE swap, the methods timed: on each table's host store, and on the kernel's pool.
    SWAP_PARTS = {"host store": ("put", "pop"), "row copies": ("pack_stored", "unpack_stored")}

    def __init__(self, model: torch.nn.Module) -> None:
        self.seconds = 0.0
        self.parts: Dict[str, float] = dict.fromkeys(self.SWAP_PARTS, 0.0)
        for kernel in sharded_kernels(model):
            if isinstance(kernel, HashRows):
                mapper = kernel._mapper  # the benchmark's own timers around our parts; nothing else changes
                mapper.map_on_host = self._timed(mapper.map_on_host, None)  # type: ignore[method-assign]
            if isinstance(kernel, KeyValueRows):
                owners = {"host store": kernel._stores, "row copies": [kernel.pool]}
                for part, methods in self.SWAP_PARTS.items():
                    for owner in owners[part]:
                        for method in methods:
                            setattr(owner, method, self._timed(getattr(owner, method), part))

    def _timed(self, fn: Callable[..., Any], part: Optional[str]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if part is None:
                    self.seconds += time.perf_counter() - start
                else:
                    self.parts[part] += time.perf_counter() - start
        return timed


def shard(name: str, model: DLRMTrain, constraints: Dict[str, ParameterConstraints], sharders: List[ModuleSharder],
          batches: List[Batch], pg: dist.ProcessGroup) -> Variant:
    """``model`` sharded by DMP over ``pg`` with the stock planner under ``constraints``, as a :class:`Variant`."""
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=pg.size(), compute_device="cpu"),
                                       constraints=constraints)
    plan = planner.plan(model, sharders)  # every rank plans alike (no collective needed)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"),
                                   plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda params: torch.optim.Adagrad(params, lr=LR))
    placement = {table: list(option.ranks or []) for table, option in plan.plan[EBC_PATH].items()}
    return Variant(name, dmp, dense, batches, placement)


def time_interleaved(variants: List[Variant], runs: int, steps: int, warmup: int,
                     between: Callable[[Variant], None] = lambda v: None) -> None:
    """Warm every variant up, then time ``runs`` rounds of ``steps`` steps, variants in turn (``v.seconds``).

    ``between(v)`` runs right after ``v``'s warm-up (e.g. to snapshot counters).
    """
    for v in variants:
        for _ in range(warmup):
            v.step()
        between(v)
    for _ in range(runs):
        for v in variants:
            v.seconds.append(v.run(steps))


def samples_per_s(v: Variant, w: Workload, steps: int, world: int) -> List[float]:
    """Global samples per second of each timed run."""
    return [steps * w.batch * world / s for s in v.seconds]


def round_ratios(runs: Sequence[float], baseline_runs: Sequence[float]) -> List[float]:
    """Per round ``r``, ``runs[r] / baseline_runs[r]``."""
    return [run / base for run, base in zip(runs, baseline_runs)]


def paired_ratio(runs: Sequence[float], baseline_runs: Sequence[float]) -> float:
    """Median over rounds of ``runs[r] / baseline_runs[r]``.

    The variants of a round run back to back, so a round's ratio cancels most of the load other jobs put on the
    machine at that time; the ratio of two medians would mix rounds run under different loads.
    """
    return statistics.median(round_ratios(runs, baseline_runs))


def init_rank() -> dist.ProcessGroup:
    """Start this rank: one thread, gloo with a timeout (a failed rank must not hang the others forever)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return dist.group.WORLD


def finish_rank(pg: dist.ProcessGroup, out: str, result: Dict[str, Any]) -> NoReturn:
    """Rank 0 writes ``result`` to ``out``; all ranks leave the group together and end."""
    if pg.rank() == 0:
        Path(out).write_text(json.dumps(result))
    dist.barrier()
    end_rank()


def as_rank(args: argparse.Namespace) -> bool:
    """True in a rank started by :func:`launch` (``args`` then gets the launcher's settings)."""
    if not args.cases:
        return False
    vars(args).update(json.loads(args.cases)[0])
    return True


def launch(script: Path, args: argparse.Namespace) -> Dict[str, Any]:
    """Run ``script`` on 2 ranks with ``args`` as its settings; returns what rank 0 wrote."""
    settings = {k: v for k, v in vars(args).items() if k not in ("cases", "out", "json")}
    return run_distributed(script, world_size=2, cases=[settings], timeout=args.timeout)


def run_benchmark(script: Path, parser: argparse.ArgumentParser,
                  rank_main: Callable[[argparse.Namespace], NoReturn],
                  summarize: Callable[[argparse.Namespace, Dict[str, Any]], Dict[str, Any]]) -> int:
    """The ``main`` of a 2-rank benchmark ``script`` whose ``parser`` has :func:`add_workload_args`'s arguments.

    In a rank started by :func:`launch` it runs ``rank_main`` (which ends the process); otherwise it launches the
    2 ranks, passes what rank 0 wrote to ``summarize`` and writes the result to ``--json`` when given.

    Example::

        sys.exit(run_benchmark(Path(__file__), parser, rank_main, summarize))
    """
    args = parser.parse_args()
    if as_rank(args):
        rank_main(args)  # ends the process
    result = summarize(args, launch(script, args))
    if args.json:
        write_result(args.json, result)
    return 0

"""Stock TorchRec under DistributedModelParallel vs. the unsharded reference, one process group, many cases.

This script uses only torch and torchrec: it never imports torchrec_ascend. Whatever makes it pass on a device is
what the installed plugin injected through torch's ``torch.backends`` entry point. Run it with torchrun::

    torchrun --standalone --nproc-per-node 2 sharding_matrix.py --cases '[{"kind": "ebc", ...}]' --out out.json

Case kinds (JSON objects):

* ``{"kind": "ebc"|"ec", "sharding_type": ..., "optimizer": "sgd"|"adagrad"|"rowwise_adagrad"}``: shard the module
  with the stock planner constrained to that sharding type, train a few steps with the optimizer fused into
  backward (``apply_optimizer_in_backward``, the TorchRec idiom), and compare every step's forward output and the
  final weights with the unsharded module trained on the global batch.
  Optional keys vary the setting (each has a default): ``"batch"``: ``"variable"`` (rank ``r`` has ``BATCH - 2r``
  samples), ``"empty"`` (rank 0 has none) or ``"vbe"`` (TorchRec's variable batch per feature,
  ``stride_per_key_per_rank`` with ``inverse_indices``); ``"pooling": "mean"``; ``"weighted": true`` (per-sample
  weights); ``"dims": "mixed"`` (tables of dims 16, 8, 24); ``"dtype": "fp16"`` (``data_type=FP16`` tables, compared
  with the reference's weights rounded to fp16 each step); ``"index": "int32"`` (int32 values and lengths);
  ``"eval": true`` (also an eval-mode forward under ``torch.no_grad()`` after training).
* ``{"kind": "pipeline", "pipeline": "sparse_dist"|"prefetch"|"eval"|"semi_sync", "kernel": "fused"|"key_value"}``:
  a stock TorchRec pipeline vs a plain loop, same initial weights; every step's output, a held-out batch's output
  in eval mode and (FUSED) the final weights are compared. ``side_stream_copies``: how many of the pipeline's
  batches were copied to the device on a stream other than the default one (0 on the CPU, which has none).
* ``{"kind": "copy"}``: ``DistributedModelParallel.copy()`` to the device it is on: same outputs and weights, and the
  copy trains.
* ``{"kind": "dcp", "module": "ebc"|"ec", "sharding_type": ..., "kernel": "key_value"|"fused", "load_sharding_type":
  ..., "load_kernel": ..., "load_world_size": N}``: ``dcp.save({"model": dmp.state_dict(), "optim":
  dmp.fused_optimizer.state_dict()})`` after a few steps (KEY_VALUE tables with a small device cache and host budget,
  so rows live on disk too), the model trains on; a fresh model of the load layout on the first N ranks
  ``dcp.load``s the same and ``load_state_dict``s both. ``weight_err`` / ``state_err``: every table's rows / fused
  optimizer state against the saved model's at the save (all ranks' shards gathered); with the layout unchanged,
  ``fwd_err``: the outputs of the steps after against the saved model's own.

The sharded model and its batches live on the suite's device (``device_env.script_device()``: the
``TORCHREC_ASCEND_CONFORMANCE_DEVICE`` the suite sets from the backend profile, the CPU when unset); the unsharded
reference stays on the CPU. The cases run through the suite's shared loop (``case_loop.main``, stock-only like this
script). Rank 0 writes one result per case: ``fwd_err``, ``weight_err``, ``moved`` (how far the weights moved, so a
no-op cannot pass), ``residency`` (where the sharded model's parameters, optimizer state, batches and outputs
lived) and ``error`` (the exception text if the case raised).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torchrec
import torchrec.optim as trec_optim
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

if __package__:  # imported through the suite's package (the plugin's scripts reuse its models)
    from .case_loop import main, residency
    from .device_env import script_device
else:  # run as a script (torchrun): this folder is sys.path[0], and torchrec_ascend is never imported here
    from case_loop import main, residency  # type: ignore[import-not-found,no-redef]  # found as a script
    from device_env import script_device  # type: ignore[import-not-found,no-redef]  # found as a script

DIM = 16  # every table's dim; column-wise types split it into 8-wide shards
TABLES = [("t0", 40, DIM), ("t1", 48, DIM), ("t2", 32, DIM)]  # name, rows, dim
BATCH, STEPS, MAX_LEN, LR = 4, 3, 3, 0.1
COLLECTIVE_TIMEOUT_S = 120
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": LR}),
    "adagrad": (torch.optim.Adagrad, {"lr": LR, "eps": 1e-8}),  # fbgemm's eps; torch defaults to 1e-10
    "rowwise_adagrad": (trec_optim.RowWiseAdagrad, {"lr": LR, "eps": 1e-8}),
    "adam": (torch.optim.Adam, {"lr": LR, "eps": 1e-8}),
    "partial_rowwise_adam": (trec_optim.PartialRowWiseAdam, {"lr": LR, "eps": 1e-8}),
}


@dataclasses.dataclass(frozen=True)
class Variant:
    """The optional case keys (see the module docstring), with their defaults."""

    batch: str = "uniform"
    pooling: str = "sum"
    weighted: bool = False
    dims: str = "equal"
    dtype: str = "fp32"
    index: str = "int64"
    eval: bool = False

    @staticmethod
    def of(case: Dict[str, Any]) -> "Variant":
        return Variant(**{f.name: case[f.name] for f in dataclasses.fields(Variant) if f.name in case})

    def tables(self) -> List[Tuple[str, int, int]]:
        dims = (16, 8, 24) if self.dims == "mixed" else (DIM,) * len(TABLES)
        return [(n, r, d) for (n, r, _), d in zip(TABLES, dims)]

    def samples(self, rank: int, feature: int) -> int:
        """Distinct samples of ``feature`` in ``rank``'s batch."""
        if self.batch == "vbe":
            return max(1, BATCH - feature - rank)
        if self.batch == "variable":
            return BATCH - 2 * rank
        if self.batch == "empty":
            return 0 if rank == 0 else BATCH
        return BATCH

    def output_batch(self, rank: int) -> int:
        """Samples of ``rank``'s output (with VBE: after ``inverse_indices`` expands each feature)."""
        return BATCH if self.batch == "vbe" else self.samples(rank, 0)


def make_module(kind: str, variant: Variant = Variant(), dtype: Any = None) -> torch.nn.Module:
    from torchrec.modules.embedding_configs import DataType, PoolingType

    features = lambda name: [f"f_{name}"]
    data_type = DataType.FP16 if (dtype or variant.dtype) == "fp16" else DataType.FP32
    if kind == "ec":
        return torchrec.EmbeddingCollection(
            tables=[torchrec.EmbeddingConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=features(n),
                                             data_type=data_type)
                    for n, r, d in variant.tables()],
            device=torch.device("cpu"),
        )
    pooling = PoolingType.MEAN if variant.pooling == "mean" else PoolingType.SUM
    return torchrec.EmbeddingBagCollection(
        tables=[torchrec.EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=features(n),
                                            pooling=pooling, data_type=data_type)
                for n, r, d in variant.tables()],
        is_weighted=variant.weighted,
        device=torch.device("cpu"),
    )


def _samples(step: int, rank: int, variant: Variant) -> List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per feature of ``rank``'s batch: lengths, values and weights of its distinct samples."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    out = []
    for i, (_, rows, _) in enumerate(variant.tables()):
        lengths = torch.randint(0, MAX_LEN + 1, (variant.samples(rank, i),), generator=gen)
        values = torch.randint(0, rows, (int(lengths.sum()),), generator=gen)
        out.append((lengths, values, torch.rand(values.numel(), generator=gen)))
    return out


def _inverse(rank: int, variant: Variant) -> List[torch.Tensor]:
    return [torch.arange(BATCH) % variant.samples(rank, i) for i in range(len(TABLES))]


def make_batch(step: int, rank: int, variant: Variant = Variant()) -> KeyedJaggedTensor:
    """``rank``'s local batch as the sharded model receives it."""
    keys = [f"f_{n}" for n, _, _ in variant.tables()]
    parts = _samples(step, rank, variant)
    index = torch.int32 if variant.index == "int32" else torch.int64
    lengths = torch.cat([p[0] for p in parts]).to(index)
    values = torch.cat([p[1] for p in parts]).to(index)
    weights = torch.cat([p[2] for p in parts]) if variant.weighted else None
    if variant.batch == "vbe":
        return KeyedJaggedTensor(
            keys=keys, values=values, lengths=lengths, weights=weights,
            stride_per_key_per_rank=[[p[0].numel()] for p in parts],
            inverse_indices=(keys, torch.stack(_inverse(rank, variant))),
        )
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths, weights=weights)


def _expanded(step: int, rank: int, variant: Variant) -> List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per feature, ``rank``'s samples as the output sees them (VBE's inverse_indices applied)."""
    parts = _samples(step, rank, variant)
    if variant.batch != "vbe":
        return parts
    out = []
    for (lengths, values, weights), inverse in zip(parts, _inverse(rank, variant)):
        starts = torch.cumsum(lengths, 0) - lengths
        picks = torch.cat([torch.arange(int(starts[j]), int(starts[j] + lengths[j])) for j in inverse.tolist()]
                          + [torch.empty(0, dtype=torch.int64)])
        out.append((lengths[inverse], values[picks], weights[picks]))
    return out


def global_batch(step: int, world: int, variant: Variant = Variant()) -> KeyedJaggedTensor:
    """Every rank's samples, rank after rank within each feature, for the unsharded reference."""
    parts = [_expanded(step, r, variant) for r in range(world)]
    keys = [f"f_{n}" for n, _, _ in variant.tables()]
    per_feature = [[p[f] for p in parts] for f in range(len(keys))]  # feature-major
    lengths = torch.cat([x[0] for feature in per_feature for x in feature])
    values = torch.cat([x[1] for feature in per_feature for x in feature])
    weights = torch.cat([x[2] for feature in per_feature for x in feature]) if variant.weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths, weights=weights)


def output_rows(kind: str, out: Any) -> torch.Tensor:
    """Forward output as a 2-D tensor: [B, sum(D)] pooled, or [values, D] (features concatenated) for sequences."""
    if kind == "ec":
        return torch.cat([out[k].values() for k in sorted(out.keys())]).float()
    per_key = out.to_dict()  # a sharded module may order its output keys differently
    return torch.cat([per_key[k] for k in sorted(per_key)], dim=1).float()


def loss_of(kind: str, rows: torch.Tensor, step: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + step)
    return (rows * torch.randn(rows.shape, generator=gen).to(rows.device)).sum()


def split_rank_rows(
    kind: str, ref_out: Any, step: int, rank: int, world: int, variant: Variant = Variant()
) -> torch.Tensor:
    """The rows of the global reference output that belong to ``rank``'s local batch."""
    if kind == "ebc":
        start = sum(variant.output_batch(r) for r in range(rank))
        return output_rows(kind, ref_out)[start:start + variant.output_batch(rank)]
    pieces = []
    local = [_expanded(step, r, variant) for r in range(world)]
    for f, key in enumerate(sorted(ref_out.keys())):
        sizes = [int(p[f][0].sum()) for p in local]
        pieces.append(torch.split(ref_out[key].values(), sizes)[rank])
    return torch.cat(pieces).float()


def plan_and_shard(
    module: torch.nn.Module, sharding_type: str, pg: dist.ProcessGroup, kernel: str = "fused",
    disk: Optional[str] = None,
) -> DistributedModelParallel:
    """``module`` sharded over ``pg``. KEY_VALUE without ``disk``: a device cache of the whole shard (a batch here may
    touch most of a shard's rows; eviction and swapping are the plugin's own suite's business), so a pipeline's
    prefetch path is what is tested; with ``disk``: a cache of 60% of the shard over a 2 KB host budget in ``disk``
    (rows in every tier)."""
    from torchrec.distributed.types import CacheParams, KeyValueParams

    kernel = "dense" if sharding_type == "data_parallel" else kernel
    key_value = kernel == "key_value"
    cache = CacheParams(load_factor=0.6 if disk else 1.0) if key_value else None
    tiers = KeyValueParams(ssd_storage_directory=disk, l2_cache_size=2e-6) if key_value and disk else None
    constraints = {
        # min_partition: split columns into 8-wide shards so column-wise types really shard (else 1 shard = TW)
        n: ParameterConstraints(sharding_types=[sharding_type], compute_kernels=[kernel], min_partition=8,
                                cache_params=cache, key_value_params=tiers)
        for n, _, _ in TABLES
    }
    device = script_device()
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=pg.size(), compute_device=device.type), constraints=constraints
    )
    sharders = get_default_sharders()
    # Every rank plans (deterministically) instead of collective_plan: a planning error then fails all ranks alike
    # instead of leaving the others waiting in the plan broadcast.
    plan = planner.plan(module, sharders)
    return DistributedModelParallel(
        module, env=ShardingEnv.from_process_group(pg), device=device, plan=plan, sharders=sharders
    )


class ColumnShardRowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad with the per-row state kept per block of ``block`` columns.

    That is what EXACT_ROWWISE_ADAGRAD does on a column-sharded table: each column shard keeps its own row state
    (the mean of squared gradients over *its* columns), so the unsharded torchrec RowWiseAdagrad is not the oracle.
    """

    def __init__(self, params: Any, lr: float, eps: float, block: int) -> None:
        super().__init__(params, {"lr": lr, "eps": eps, "block": block})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]  # no closure, returns no loss
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                rows, cols = p.grad.shape
                b = group["block"]
                state = self.state[p].setdefault("sum", torch.zeros(rows, cols // b))
                state += p.grad.view(rows, cols // b, b).pow(2).mean(dim=2)
                std = state.sqrt().add(group["eps"]).repeat_interleave(b, dim=1)
                p.addcdiv_(p.grad, std, value=-group["lr"])


class TouchedRowsAdam(torch.optim.Optimizer):
    """The oracle of fused ADAM and PARTIAL_ROWWISE_ADAM on an embedding table: Adam on the rows a step touched.

    A row the batch did not touch does not step (its gradient is all zero; the scripts' random loss weights never
    give a touched row a zero gradient). ADAM: ``torch.optim.AdamW``'s own update on the touched rows (gathered into
    a parameter of their own with their moments); PARTIAL_ROWWISE_ADAM (``rowwise``) has no torch optimizer: its
    update is written out (second moment: the mean over a row's columns of the squared gradient, one per ``block``
    of columns as a column shard keeps it). Bias correction counts the table's steps (fbgemm's ``iter``: one per
    training lookup of the table, touched or not), not the row's, as fbgemm's ADAM does on CUDA.
    """

    def __init__(self, params: Any, lr: float, eps: float, betas: Tuple[float, float] = (0.9, 0.999),
                 weight_decay: float = 0.0, rowwise: bool = False, block: Any = None) -> None:
        super().__init__(params, {"lr": lr, "eps": eps, "betas": betas, "weight_decay": weight_decay,
                                  "rowwise": rowwise, "block": block})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]  # no closure, returns no loss
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                rows = p.grad.abs().sum(dim=1).nonzero().squeeze(1)
                if group["rowwise"]:
                    self._rowwise(group, p, rows, state)
                    continue
                touched = torch.nn.Parameter(p[rows].clone())
                touched.grad = p.grad[rows].clone()
                beta1, beta2 = group["betas"]
                inner = torch.optim.AdamW([touched], lr=group["lr"], betas=(beta1, beta2), eps=group["eps"],
                                          weight_decay=group["weight_decay"], foreach=False)
                inner.state[touched] = {"step": torch.tensor(float(state["step"] - 1)),
                                        "exp_avg": state["exp_avg"][rows].clone(),
                                        "exp_avg_sq": state["exp_avg_sq"][rows].clone()}
                inner.step()
                p[rows] = touched.detach()
                state["exp_avg"][rows] = inner.state[touched]["exp_avg"]
                state["exp_avg_sq"][rows] = inner.state[touched]["exp_avg_sq"]

    @staticmethod
    def _rowwise(group: Dict[str, Any], p: torch.Tensor, rows: torch.Tensor, state: Dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        assert p.grad is not None
        g, w, step = p.grad[rows], p[rows], state["step"]
        block = group["block"] or p.shape[1]
        m = beta1 * state["exp_avg"][rows] + (1 - beta1) * g
        square = (g * g).view(len(rows), p.shape[1] // block, block).mean(dim=2).repeat_interleave(block, dim=1)
        v = beta2 * state["exp_avg_sq"][rows] + (1 - beta2) * square  # the row's value, repeated per column
        m_hat, v_hat = m / (1 - beta1 ** step), v / (1 - beta2 ** step)
        p[rows] = w - group["lr"] * (m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * w)
        state["exp_avg"][rows], state["exp_avg_sq"][rows] = m, v


#: Oracles of the fused optimizers whose unsharded torch optimizer would step rows a batch did not touch.
SPARSE_ORACLES: Dict[str, Tuple[Any, Dict[str, Any]]] = {
    "adam": (TouchedRowsAdam, {}),
    "partial_rowwise_adam": (TouchedRowsAdam, {"rowwise": True}),
}


def min_column_shard(dmp: Any) -> Any:
    """The narrowest column shard of the plan, or None if no table is split by columns."""
    widths = []
    for ps in dmp.plan.plan[""].values():
        shards = getattr(ps.sharding_spec, "shards", None) or []
        cols = max((sh.shard_offsets[1] + sh.shard_sizes[1] for sh in shards), default=0)
        widths += [sh.shard_sizes[1] for sh in shards if sh.shard_sizes[1] < cols]
    return min(widths) if widths else None


def copy_reference_weights(dmp: torch.nn.Module, reference: Dict[str, torch.Tensor]) -> None:
    """Write the unsharded weights into the sharded model (CPU DMP re-initialises tables at sharding)."""
    with torch.no_grad():
        for name, value in dmp.state_dict().items():
            ref = reference[_unsharded_name(name)]
            if hasattr(value, "local_shards"):
                for shard in value.local_shards():
                    shard.tensor.copy_(_slice(ref, shard.metadata))
            else:
                value.copy_(ref)


def max_weight_error(dmp: torch.nn.Module, reference: Dict[str, torch.Tensor]) -> float:
    err = 0.0
    for name, value in dmp.state_dict().items():
        ref = reference[_unsharded_name(name)]
        if hasattr(value, "local_shards"):
            for shard in value.local_shards():
                err = max(err, _max_abs(shard.tensor.float().cpu() - _slice(ref, shard.metadata)))
        else:
            err = max(err, _max_abs(value.float().cpu() - ref))
    return err


def _unsharded_name(name: str) -> str:
    return name[len("module."):] if name.startswith("module.") else name


def _slice(ref: torch.Tensor, metadata: Any) -> torch.Tensor:
    (r0, c0), (rows, cols) = metadata.shard_offsets, metadata.shard_sizes
    return ref[r0:r0 + rows, c0:c0 + cols]


def run_sharding_case(case: Dict[str, Any], pg: dist.ProcessGroup) -> Dict[str, Any]:
    rank, world = pg.rank(), pg.size()
    kind, sharding_type = case["kind"], case["sharding_type"]
    variant = Variant.of(case)
    opt_cls, opt_kwargs = OPTIMIZERS[case["optimizer"]]
    torch.manual_seed(0)
    reference = make_module(kind, variant, dtype="fp32")
    if variant.dtype == "fp16":
        with torch.no_grad():  # the sharded tables hold fp16: start the reference from the same values
            for p in reference.parameters():
                p.copy_(p.half().float())
    sharded_source = make_module(kind, variant)
    initial = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    source_params = sharded_source.embeddings if kind == "ec" else sharded_source.embedding_bags
    apply_optimizer_in_backward(opt_cls, source_params.parameters(), dict(opt_kwargs))
    dmp = plan_and_shard(sharded_source, sharding_type, pg)
    copy_reference_weights(dmp, initial)

    params = reference.embeddings if kind == "ec" else reference.embedding_bags
    block = min_column_shard(dmp)
    if opt_cls is trec_optim.RowWiseAdagrad and block is not None:
        # A column-sharded table keeps row-wise state per shard: that is the semantics to compare against.
        opt_cls, opt_kwargs = ColumnShardRowWiseAdagrad, {**opt_kwargs, "block": block}
    oracle_cls, oracle_kwargs = opt_cls, dict(opt_kwargs)
    if case["optimizer"] in SPARSE_ORACLES and sharding_type != "data_parallel":  # replicas: a dense optimizer
        oracle_cls, extra = SPARSE_ORACLES[case["optimizer"]]
        oracle_kwargs.update(extra, **({"block": block} if extra.get("rowwise") else {}))
    apply_optimizer_in_backward(oracle_cls, params.parameters(), oracle_kwargs)
    # Tables not fused into backward (data_parallel) are trained by a dense optimizer, as TorchRec users do.
    dense_params = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    dense = KeyedOptimizerWrapper(dense_params, lambda ps: opt_cls(ps, **opt_kwargs)) if dense_params else None
    # TorchRec averages embedding gradients over ranks (DDP for data_parallel, gradient division in the
    # all-to-all backward otherwise): the reference loss is the mean of the ranks' losses.
    scale = 1.0 / world

    fwd_err, device = 0.0, script_device()
    for step in range(STEPS):
        ref_out = reference(global_batch(step, world, variant))
        mine = split_rank_rows(kind, ref_out, step, rank, world, variant)
        total: Any = sum(
            loss_of(kind, split_rank_rows(kind, ref_out, step, r, world, variant), step, seed=100 * r)
            for r in range(world)
        )
        (total * scale).backward()

        batch = make_batch(step, rank, variant).to(device)
        out = output_rows(kind, dmp(batch))
        fwd_err = max(fwd_err, _max_abs(out.detach().cpu() - mine.detach()))
        loss_of(kind, out, step, seed=100 * rank).backward()
        if dense is not None:
            dense.step()
            dense.zero_grad()

    eval_err = None
    if variant.eval:
        dmp.eval()
        reference.eval()
        with torch.no_grad():
            mine = split_rank_rows(kind, reference(global_batch(STEPS, world, variant)), STEPS, rank, world, variant)
            eval_err = _max_abs(output_rows(kind, dmp(make_batch(STEPS, rank, variant).to(device))).cpu() - mine)
        fwd_err = max(fwd_err, eval_err)
    final = {k: v.detach() for k, v in reference.state_dict().items()}
    moved = max((final[k] - initial[k]).abs().max().item() for k in final)
    shards = [len(getattr(p.sharding_spec, "shards", []) or []) for p in dmp.plan.plan[""].values()]
    return {"fwd_err": fwd_err, "eval_err": eval_err, "weight_err": max_weight_error(dmp, final), "moved": moved,
            "shards": max(shards),
            "residency": residency(parameters=dmp, optimizer=[dmp.fused_optimizer, dense], inputs=batch, outputs=out)}


def _max_abs(diff: torch.Tensor) -> float:
    return diff.abs().max().item() if diff.numel() else 0.0


class SparseArch(torch.nn.Module):
    """A tiny model for pipeline tests: EBC -> linear on pooled embeddings and dense features -> BCE loss."""

    def __init__(self) -> None:
        super().__init__()
        self.ebc = make_module("ebc")
        self.head = torch.nn.Linear(sum(d for _, _, d in TABLES) + 2, 1)

    def forward(self, batch: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        pooled = self.ebc(batch.sparse_features).values()
        logits = self.head(torch.cat([pooled, batch.dense_features], dim=1)).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels), logits


#: Per batch copied to a device with streams: whether the copy ran on a stream other than the default one.
COPIED_ON_SIDE_STREAM: List[bool] = []


def pipeline_batch(step: int, rank: int) -> Any:
    from torchrec.datasets.utils import Batch

    class StreamNotingBatch(Batch):
        """A stock ``Batch`` that notes the stream its device copy ran on (a pipeline copies on its memcpy stream,
        if the device has streams for it)."""

        def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
            streams = torch.get_device_module(device) if device.type != "cpu" else None
            if streams is not None and hasattr(streams, "current_stream"):
                COPIED_ON_SIDE_STREAM.append(streams.current_stream(device) != streams.default_stream(device))
            return super().to(device, non_blocking)

    gen = torch.Generator().manual_seed(5000 + 1000 * step + rank)
    return StreamNotingBatch(
        dense_features=torch.randn(BATCH, 2, generator=gen),
        sparse_features=make_batch(step, rank),
        labels=torch.randint(0, 2, (BATCH,), generator=gen).float(),
    )


def sharded_arch(pg: dist.ProcessGroup, initial: Dict[str, torch.Tensor], kernel: str = "fused") -> Tuple[Any, Any]:
    torch.manual_seed(0)
    model = SparseArch()
    apply_optimizer_in_backward(torch.optim.SGD, model.ebc.embedding_bags.parameters(), {"lr": LR})
    dmp = plan_and_shard(model, "row_wise", pg, kernel)
    copy_reference_weights(dmp, initial)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda ps: torch.optim.SGD(ps, lr=LR)
    )
    return dmp, dense


def _pipeline(name: str, model: Any, optimizer: Any) -> Any:
    from torchrec.distributed.train_pipeline.train_pipelines import (
        EvalPipelineSparseDist,
        PrefetchTrainPipelineSparseDist,
        TrainPipelineSemiSync,
    )

    device = script_device()
    if name == "semi_sync":  # refused on the CPU by the plugin (TorchRec's lookup there needs CUDA streams)
        return TrainPipelineSemiSync(model, optimizer, device, start_batch=0)
    cls = {"sparse_dist": TrainPipelineSparseDist, "prefetch": PrefetchTrainPipelineSparseDist,
           "eval": EvalPipelineSparseDist}[name]
    return cls(model, optimizer, device)


def _plain_outputs(name: str, model: Any, optimizer: Any, batches: List[Any]) -> List[torch.Tensor]:
    """What the pipeline must produce, in a plain loop: every batch's logits (a pipeline's ``progress()`` returns
    the model's output, not its loss), with the same updates. The batches go to the device here, as the pipeline
    copies them."""
    batches = [b.to(script_device()) for b in batches]
    if name == "eval":
        model.eval()
        with torch.no_grad():
            return [model(b)[1] for b in batches]
    outputs = []
    for b in batches:
        optimizer.zero_grad()
        loss, logits = model(b)
        loss.backward()
        optimizer.step()
        outputs.append(logits.detach())
    return outputs


def run_pipeline_case(case: Dict[str, Any], pg: dist.ProcessGroup) -> Dict[str, Any]:
    """A stock pipeline vs the plain loop it stands for: every step's output, then the trained models' outputs on a
    held-out batch in eval mode, and (FUSED) every weight."""
    rank, name, kernel = pg.rank(), case.get("pipeline", "sparse_dist"), case.get("kernel", "fused")
    torch.manual_seed(0)
    initial = {k: v.detach().clone() for k, v in SparseArch().state_dict().items()}
    steps = 6
    batches = [pipeline_batch(step, rank) for step in range(steps)]

    plain, plain_opt = sharded_arch(pg, initial, kernel)
    expected = _plain_outputs(name, plain, plain_opt, batches)
    piped, piped_opt = sharded_arch(pg, initial, kernel)
    if name == "eval":
        piped.eval()
    pipeline = _pipeline(name, piped, piped_opt)
    COPIED_ON_SIDE_STREAM.clear()
    feed = iter(batches)
    outputs: List[torch.Tensor] = []
    with torch.no_grad() if name == "eval" else contextlib.nullcontext():
        while True:
            try:
                outputs.append(pipeline.progress(feed).detach())
            except StopIteration:
                break
    if len(outputs) != steps:
        raise RuntimeError(f"{name}: the pipeline ran {len(outputs)} of {steps} batches")
    fwd_err = max(_max_abs(a - b) for a, b in zip(outputs, expected))
    pipeline.detach()  # the model's own forward again
    held_out = pipeline_batch(steps, rank).to(script_device())
    for model in (plain, piped):
        model.eval()
    with torch.no_grad():
        fwd_err = max(fwd_err, _max_abs(plain(held_out)[1] - piped(held_out)[1]))
    plain_state = dict(plain.state_dict())
    err, moved = 0.0, 0.0
    for key, value in piped.state_dict().items():
        other = plain_state[key]
        ref = initial.get(_unsharded_name(key))
        if hasattr(value, "local_shards"):
            if kernel == "key_value":
                continue  # a placeholder of the table's shape: its rows live in the cache tiers
            for a, b in zip(value.local_shards(), other.local_shards()):
                err = max(err, _max_abs(a.tensor - b.tensor))
                moved = max(moved, _max_abs(a.tensor.cpu() - _slice(ref, a.metadata)))  # type: ignore[arg-type]  # sharded: has its initial copy
        else:
            err = max(err, _max_abs(value - other))
            if ref is not None and name != "eval":
                moved = max(moved, _max_abs(value.cpu() - ref))
    if name == "eval":
        moved = max(_max_abs(x) for x in outputs)  # nothing trains; the outputs must not be all zero
    return {"fwd_err": fwd_err, "weight_err": err, "moved": moved, "steps": len(outputs),
            "side_stream_copies": sum(COPIED_ON_SIDE_STREAM),
            "residency": residency(parameters=piped, optimizer=[piped.fused_optimizer, piped_opt], inputs=held_out,
                                   outputs=outputs)}


def run_copy_case(pg: dist.ProcessGroup) -> Dict[str, Any]:
    """``DMP.copy()`` to the suite's device: the copy's outputs and weights equal the original's, and the copy trains.
    (Copied to the device it is on, stock ``DMP.copy()`` shares the sharded tables' storage with the original: a step
    of either moves both. A copy to another device before the first forward keeps the lazily made input dists on the
    original's device: stock TorchRec, any device.)"""
    torch.manual_seed(0)
    module = make_module("ebc")
    apply_optimizer_in_backward(torch.optim.SGD, module.embedding_bags.parameters(), {"lr": LR})
    dmp = plan_and_shard(module, "table_wise", pg)
    saved = torch.Tensor.__deepcopy__, torch.nn.Parameter.__deepcopy__
    try:
        copied = dmp.copy(script_device())
    finally:  # stock sharded_model_copy leaves these patched when it fails half-way
        torch.Tensor.__deepcopy__, torch.nn.Parameter.__deepcopy__ = saved  # type: ignore[method-assign]  # put back
    batch = make_batch(0, pg.rank()).to(script_device())
    before = output_rows("ebc", dmp(batch)).detach()
    err = _max_abs(output_rows("ebc", copied(batch)) - before)
    original = {k: _local_rows(v) for k, v in dmp.state_dict().items()}
    weight_err = max(_max_abs(_local_rows(v) - original[k]) for k, v in copied.state_dict().items())
    loss_of("ebc", output_rows("ebc", copied(batch)), 0, seed=100 * pg.rank()).backward()  # trains the copy only
    moved = max(_max_abs(_local_rows(v) - original[k]) for k, v in copied.state_dict().items())
    return {"fwd_err": err, "weight_err": weight_err, "moved": moved,
            "residency": residency(parameters=copied, optimizer=[copied.fused_optimizer], inputs=batch,
                                   outputs=before)}


def _local_rows(value: Any) -> torch.Tensor:
    """A state_dict entry as one local tensor (a ShardedTensor's local shards concatenated)."""
    if hasattr(value, "local_shards"):
        shards = [s.tensor.detach().reshape(-1) for s in value.local_shards()]
        return torch.cat(shards).clone() if shards else torch.empty(0)
    return value.detach().reshape(-1).clone()


def _dcp_model(case: Dict[str, Any], sharding_type: str, kernel: str, pg: dist.ProcessGroup, disk: str
               ) -> DistributedModelParallel:
    torch.manual_seed(0)
    module = make_module(case["module"])
    tables = module.embeddings if case["module"] == "ec" else module.embedding_bags
    cls, kwargs = OPTIMIZERS["rowwise_adagrad"]
    apply_optimizer_in_backward(cls, tables.parameters(), dict(kwargs))
    return plan_and_shard(module, sharding_type, pg, kernel, disk=disk)


def _dcp_step(model: Any, kind: str, step: int, pg: dist.ProcessGroup) -> torch.Tensor:
    """One training step of ``model`` on ``pg``'s batches; returns this rank's outputs."""
    rows = output_rows(kind, model(make_batch(step, pg.rank()).to(script_device())))
    (loss_of(kind, rows, step, seed=pg.rank()) * pg.size()).backward()  # TorchRec averages table gradients: undo it
    return rows.detach().cpu()


def _full_tables(model: Any, pg: dist.ProcessGroup) -> Dict[str, torch.Tensor]:
    """Every ShardedTensor of ``model.state_dict()`` and of its fused optimizer's, whole (all ranks' shards)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    entries = dict(model.state_dict())
    for param, states in model.fused_optimizer.state_dict()["state"].items():
        entries.update({f"{param}/{name}": value for name, value in states.items()})
    local = {key: (list(value.metadata().size), [(list(s.metadata.shard_offsets), s.tensor.detach().cpu().clone())
                                                  for s in value.local_shards()])
             for key, value in entries.items() if isinstance(value, ShardedTensor)}
    gathered: List[Any] = [None] * pg.size()
    dist.all_gather_object(gathered, local, group=pg)
    out: Dict[str, torch.Tensor] = {}
    for rank_entries in gathered:  # an optimizer's state is only on the ranks holding a shard of its table
        for key, (size, pieces) in rank_entries.items():
            whole = out.setdefault(key, torch.full(size, float("nan")))
            for offsets, piece in pieces:
                whole[tuple(slice(o, o + n) for o, n in zip(offsets, piece.shape))] = piece.float()
    return out


def _max_diff(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], optimizer: bool) -> float:
    keys = [k for k in a if ("/" in k) == optimizer]
    if not keys or set(keys) != {k for k in b if ("/" in k) == optimizer}:
        return float("inf")
    return max(float((a[k] - b[k]).abs().max()) if a[k].shape == b[k].shape else float("inf") for k in keys)


_SUBGROUPS: Dict[int, Any] = {}


def _first_ranks(pg: dist.ProcessGroup, size: int) -> Optional[dist.ProcessGroup]:
    """The first ``size`` ranks of ``pg`` (None on the others), made once per size: a module sharded over a subgroup
    may make groups of its own on those ranks only, after which a new group made by every rank would never form."""
    if size == pg.size():
        return pg
    if size not in _SUBGROUPS:
        _SUBGROUPS[size] = dist.new_group(dist.get_process_group_ranks(pg)[:size])
    return _SUBGROUPS[size] if pg.rank() < size else None


def run_dcp_case(case: Dict[str, Any], pg: dist.ProcessGroup) -> Dict[str, Any]:
    """Stock DCP round trip (see the module docstring), in a scratch folder removed afterwards."""
    import tempfile

    # Rank 0's folder holds the checkpoint (every rank writes there: one machine); each rank's disk tiers in its own.
    with tempfile.TemporaryDirectory(prefix="dcp-") as scratch:
        directory = [scratch]
        dist.broadcast_object_list(directory, src=0, group=pg)
        result = _dcp_round_trip(case, pg, directory[0], scratch)
        dist.barrier(group=pg)  # no rank still reads rank 0's checkpoint
        return result


def _dcp_round_trip(case: Dict[str, Any], pg: dist.ProcessGroup, directory: str, scratch: str) -> Dict[str, Any]:
    import tempfile

    import torch.distributed.checkpoint as dcp

    kind = case["module"]
    checkpoint_id = os.path.join(directory, "checkpoint")
    saved = _dcp_model(case, case["sharding_type"], case["kernel"], pg, tempfile.mkdtemp(prefix="disk-", dir=scratch))
    for step in range(STEPS):
        _dcp_step(saved, kind, step, pg)
    dcp.save({"model": saved.state_dict(), "optim": saved.fused_optimizer.state_dict()},
             checkpoint_id=checkpoint_id, process_group=pg)
    at_save = _full_tables(saved, pg)
    after = [_dcp_step(saved, kind, step, pg) for step in range(STEPS, 2 * STEPS)]
    group = _first_ranks(pg, case["load_world_size"])
    if group is None:
        return {}
    loaded = _dcp_model(case, case["load_sharding_type"], case["load_kernel"], group,
                        tempfile.mkdtemp(prefix="disk-", dir=scratch))
    fresh = _full_tables(loaded, group)
    state = {"model": loaded.state_dict(), "optim": loaded.fused_optimizer.state_dict()}
    dcp.load(state, checkpoint_id=checkpoint_id, process_group=group)
    loaded.load_state_dict(state["model"])
    loaded.fused_optimizer.load_state_dict(state["optim"])
    restored = _full_tables(loaded, group)
    same = (case["load_sharding_type"], case["load_kernel"], case["load_world_size"]) == (
        case["sharding_type"], case["kernel"], pg.size())
    fwd_err = 0.0
    if same:
        outputs = [_dcp_step(loaded, kind, step, group) for step in range(STEPS, 2 * STEPS)]
        fwd_err = max(_max_abs(x - y) for x, y in zip(outputs, after))
    batch = make_batch(0, group.rank()).to(script_device())
    with torch.no_grad():
        out = output_rows(kind, loaded(batch))
    return {"fwd_err": fwd_err, "weight_err": _max_diff(restored, at_save, optimizer=False),
            "state_err": _max_diff(restored, at_save, optimizer=True),
            "moved": _max_diff(fresh, at_save, optimizer=False), "continued": same,
            "residency": residency(parameters=loaded, optimizer=[loaded.fused_optimizer], inputs=batch, outputs=out)}


def run_case(case: Dict[str, Any], pg: dist.ProcessGroup) -> Dict[str, Any]:
    if case["kind"] == "dcp":
        return run_dcp_case(case, pg)
    if case["kind"] == "pipeline":
        return run_pipeline_case(case, pg)
    if case["kind"] == "copy":
        return run_copy_case(pg)
    return run_sharding_case(case, pg)


def plugin_state() -> Dict[str, Any]:
    """What torch's entry point left in sys.modules: the plugin's state, read without importing anything of it."""
    autoload = sys.modules.get("torchrec_ascend.injection.autoload")
    return {"plugin_state": autoload.STATUS.state if autoload is not None else "not loaded", "argv": sys.argv}


if __name__ == "__main__":
    main(__doc__, run_case, worst=("fwd_err", "eval_err", "weight_err", "moved", "shards", "steps"), info=plugin_state)

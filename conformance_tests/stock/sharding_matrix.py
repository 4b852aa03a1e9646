"""Stock TorchRec under DistributedModelParallel vs. the unsharded reference, one process group, many cases.

This script uses only torch and torchrec: it never imports torchrec_ascend. Whatever makes it pass on a device is
what the installed plugin injected through torch's ``torch.backends`` entry point. Run it with torchrun::

    torchrun --standalone --nproc-per-node 2 sharding_matrix.py --cases '[{"kind": "ebc", ...}]' --out out.json

Case kinds (JSON objects):

* ``{"kind": "ebc"|"ec", "sharding_type": ..., "optimizer": "sgd"|"adagrad"|"rowwise_adagrad"}``: shard the module
  with the stock planner constrained to that sharding type, train a few steps with the optimizer fused into
  backward (``apply_optimizer_in_backward``, the TorchRec idiom), and compare every step's forward output and the
  final weights with the unsharded module trained on the global batch.
* ``{"kind": "pipeline"}``: stock ``TrainPipelineSparseDist`` vs a plain training loop, same initial weights.
* ``{"kind": "copy"}``: ``DistributedModelParallel.copy()`` to the CPU.

Rank 0 writes one result per case: ``ok``, ``fwd_err``, ``weight_err``, ``moved`` (how far the weights moved, so a
no-op cannot pass) and ``error`` (the exception text if the case raised).
"""

from __future__ import annotations

import argparse
import datetime
import copy
import gc
import json
import os
import sys
import traceback
from typing import Any, Dict, List, Tuple

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

DIM = 16  # every table's dim; column-wise types split it into 8-wide shards
TABLES = [("t0", 40, DIM), ("t1", 48, DIM), ("t2", 32, DIM)]  # name, rows, dim
BATCH, STEPS, MAX_LEN, LR = 4, 3, 3, 0.1
COLLECTIVE_TIMEOUT_S = 120
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": LR}),
    "adagrad": (torch.optim.Adagrad, {"lr": LR, "eps": 1e-8}),  # fbgemm's eps; torch defaults to 1e-10
    "rowwise_adagrad": (trec_optim.RowWiseAdagrad, {"lr": LR, "eps": 1e-8}),
}


def make_module(kind: str) -> torch.nn.Module:
    features = lambda name: [f"f_{name}"]  # noqa: E731
    if kind == "ec":
        return torchrec.EmbeddingCollection(
            tables=[torchrec.EmbeddingConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=features(n))
                    for n, r, d in TABLES],
            device=torch.device("cpu"),
        )
    return torchrec.EmbeddingBagCollection(
        tables=[torchrec.EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=features(n))
                for n, r, d in TABLES],
        device=torch.device("cpu"),
    )


def make_batch(step: int, rank: int) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    keys = [f"f_{n}" for n, _, _ in TABLES]
    lengths = torch.randint(0, MAX_LEN + 1, (len(TABLES) * BATCH,), generator=gen)
    values = torch.cat(
        [torch.randint(0, rows, (int(lengths[i * BATCH:(i + 1) * BATCH].sum()),), generator=gen)
         for i, (_, rows, _) in enumerate(TABLES)]
    )
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)


def global_batch(step: int, world: int) -> KeyedJaggedTensor:
    parts = [make_batch(step, r) for r in range(world)]
    keys = parts[0].keys()
    lengths, values = [], []
    for f, key in enumerate(keys):  # feature-major layout: each feature's lengths for all ranks' samples
        for p in parts:
            lengths.append(p.lengths()[f * BATCH:(f + 1) * BATCH])
            values.append(p[key].values())
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths))


def output_rows(kind: str, out: Any) -> torch.Tensor:
    """Forward output as a 2-D tensor: [B, sum(D)] pooled, or [values, D] (features concatenated) for sequences."""
    if kind == "ec":
        return torch.cat([out[k].values() for k in sorted(out.keys())])
    per_key = out.to_dict()  # a sharded module may order its output keys differently
    return torch.cat([per_key[k] for k in sorted(per_key)], dim=1)


def loss_of(kind: str, rows: torch.Tensor, step: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + step)
    return (rows * torch.randn(rows.shape, generator=gen)).sum()


def split_rank_rows(kind: str, ref_out: Any, step: int, rank: int, world: int) -> torch.Tensor:
    """The rows of the global reference output that belong to ``rank``'s local batch."""
    if kind == "ebc":
        return output_rows(kind, ref_out)[rank * BATCH:(rank + 1) * BATCH]
    pieces = []
    local = [make_batch(step, r) for r in range(world)]
    for key in sorted(ref_out.keys()):
        sizes = [int(p[key].lengths().sum()) for p in local]
        pieces.append(torch.split(ref_out[key].values(), sizes)[rank])
    return torch.cat(pieces)


def plan_and_shard(module: torch.nn.Module, sharding_type: str, pg: dist.ProcessGroup) -> DistributedModelParallel:
    kernel = "dense" if sharding_type == "data_parallel" else "fused"
    constraints = {
        # min_partition: split columns into 8-wide shards so column-wise types really shard (else 1 shard = TW)
        n: ParameterConstraints(sharding_types=[sharding_type], compute_kernels=[kernel], min_partition=8)
        for n, _, _ in TABLES
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=pg.size(), compute_device="cpu"), constraints=constraints
    )
    sharders = get_default_sharders()
    # Every rank plans (deterministically) instead of collective_plan: a planning error then fails all ranks alike
    # instead of leaving the others waiting in the plan broadcast.
    plan = planner.plan(module, sharders)
    return DistributedModelParallel(
        module, env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"), plan=plan, sharders=sharders
    )


class ColumnShardRowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad with the per-row state kept per block of ``block`` columns.

    That is what EXACT_ROWWISE_ADAGRAD does on a column-sharded table: each column shard keeps its own row state
    (the mean of squared gradients over *its* columns), so the unsharded torchrec RowWiseAdagrad is not the oracle.
    """

    def __init__(self, params: Any, lr: float, eps: float, block: int) -> None:
        super().__init__(params, {"lr": lr, "eps": eps, "block": block})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
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


def min_column_shard(dmp: Any) -> Any:
    """The narrowest column shard of the plan, or None if no table is split by columns."""
    widths = [
        shard.shard_sizes[1]
        for ps in dmp.plan.plan[""].values()
        for shard in getattr(ps.sharding_spec, "shards", None) or []
        if shard.shard_sizes[1] < DIM
    ]
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
                err = max(err, (shard.tensor - _slice(ref, shard.metadata)).abs().max().item())
        else:
            err = max(err, (value - ref).abs().max().item())
    return err


def _unsharded_name(name: str) -> str:
    return name[len("module."):] if name.startswith("module.") else name


def _slice(ref: torch.Tensor, metadata: Any) -> torch.Tensor:
    (r0, c0), (rows, cols) = metadata.shard_offsets, metadata.shard_sizes
    return ref[r0:r0 + rows, c0:c0 + cols]


def run_sharding_case(case: Dict[str, Any], pg: dist.ProcessGroup) -> Dict[str, Any]:
    rank, world = pg.rank(), pg.size()
    kind, sharding_type = case["kind"], case["sharding_type"]
    opt_cls, opt_kwargs = OPTIMIZERS[case["optimizer"]]
    torch.manual_seed(0)
    reference = make_module(kind)
    sharded_source = copy.deepcopy(reference)
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
    apply_optimizer_in_backward(opt_cls, params.parameters(), dict(opt_kwargs))
    # Tables not fused into backward (data_parallel) are trained by a dense optimizer, as TorchRec users do.
    dense_params = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    dense = KeyedOptimizerWrapper(dense_params, lambda ps: opt_cls(ps, **opt_kwargs)) if dense_params else None
    # TorchRec averages embedding gradients over ranks (DDP for data_parallel, gradient division in the
    # all-to-all backward otherwise): the reference loss is the mean of the ranks' losses.
    scale = 1.0 / world

    fwd_err = 0.0
    for step in range(STEPS):
        ref_out = reference(global_batch(step, world))
        ref_rows = output_rows(kind, ref_out)
        mine = split_rank_rows(kind, ref_out, step, rank, world)
        total = sum(
            loss_of(kind, split_rank_rows(kind, ref_out, step, r, world), step, seed=100 * r) for r in range(world)
        )
        (total * scale).backward()
        del ref_rows

        out = output_rows(kind, dmp(make_batch(step, rank)))
        fwd_err = max(fwd_err, (out - mine.detach()).abs().max().item())
        loss_of(kind, out, step, seed=100 * rank).backward()
        if dense is not None:
            dense.step()
            dense.zero_grad()

    final = {k: v.detach() for k, v in reference.state_dict().items()}
    moved = max((final[k] - initial[k]).abs().max().item() for k in final)
    shards = [len(getattr(p.sharding_spec, "shards", []) or []) for p in dmp.plan.plan[""].values()]
    return {"fwd_err": fwd_err, "weight_err": max_weight_error(dmp, final), "moved": moved, "shards": max(shards)}


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


def pipeline_batch(step: int, rank: int) -> Any:
    from torchrec.datasets.utils import Batch

    gen = torch.Generator().manual_seed(5000 + 1000 * step + rank)
    return Batch(
        dense_features=torch.randn(BATCH, 2, generator=gen),
        sparse_features=make_batch(step, rank),
        labels=torch.randint(0, 2, (BATCH,), generator=gen).float(),
    )


def sharded_arch(pg: dist.ProcessGroup, initial: Dict[str, torch.Tensor]) -> Tuple[Any, Any]:
    torch.manual_seed(0)
    model = SparseArch()
    apply_optimizer_in_backward(torch.optim.SGD, model.ebc.embedding_bags.parameters(), {"lr": LR})
    dmp = plan_and_shard(model, "row_wise", pg)
    copy_reference_weights(dmp, initial)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda ps: torch.optim.SGD(ps, lr=LR)
    )
    return dmp, dense


def run_pipeline_case(pg: dist.ProcessGroup) -> Dict[str, Any]:
    rank = pg.rank()
    torch.manual_seed(0)
    initial = {k: v.detach().clone() for k, v in SparseArch().state_dict().items()}
    steps = 4

    plain, plain_opt = sharded_arch(pg, initial)
    for step in range(steps):
        plain_opt.zero_grad()
        loss, _ = plain(pipeline_batch(step, rank))
        loss.backward()
        plain_opt.step()

    piped, piped_opt = sharded_arch(pg, initial)
    pipeline = TrainPipelineSparseDist(piped, piped_opt, torch.device("cpu"))
    batches = iter([pipeline_batch(step, rank) for step in range(steps)])
    done = 0
    while True:
        try:
            pipeline.progress(batches)
            done += 1
        except StopIteration:
            break
    plain_state = {k: v for k, v in plain.state_dict().items()}
    err, moved = 0.0, 0.0
    for name, value in piped.state_dict().items():
        other = plain_state[name]
        if hasattr(value, "local_shards"):
            for a, b in zip(value.local_shards(), other.local_shards()):
                err = max(err, (a.tensor - b.tensor).abs().max().item())
                ref = _slice(initial[_unsharded_name(name)], a.metadata)
                moved = max(moved, (a.tensor - ref).abs().max().item())
        else:
            err = max(err, (value - other).abs().max().item())
    return {"fwd_err": 0.0, "weight_err": err, "moved": moved, "steps": done}


def run_copy_case(pg: dist.ProcessGroup) -> Dict[str, Any]:
    torch.manual_seed(0)
    module = make_module("ebc")
    apply_optimizer_in_backward(torch.optim.SGD, module.embedding_bags.parameters(), {"lr": LR})
    dmp = plan_and_shard(module, "table_wise", pg)
    saved = torch.Tensor.__deepcopy__, torch.nn.Parameter.__deepcopy__
    try:
        copied = dmp.copy(torch.device("cpu"))
    finally:  # stock sharded_model_copy leaves these patched when it fails half-way
        torch.Tensor.__deepcopy__, torch.nn.Parameter.__deepcopy__ = saved
    batch = make_batch(0, pg.rank())
    err = (output_rows("ebc", copied(batch)) - output_rows("ebc", dmp(batch))).abs().max().item()
    return {"fwd_err": err, "weight_err": 0.0, "moved": 1.0}


def run_case(case: Dict[str, Any], pg: dist.ProcessGroup) -> Dict[str, Any]:
    try:
        if case["kind"] == "pipeline":
            result = run_pipeline_case(pg)
        elif case["kind"] == "copy":
            result = run_copy_case(pg)
        else:
            result = run_sharding_case(case, pg)
        result["error"] = ""
    except Exception as err:  # reported per case, so one failure does not hide the others
        result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
    # Every rank's numbers matter: take the worst over ranks.
    gathered: List[Any] = [None] * pg.size()
    dist.all_gather_object(gathered, result, group=pg)
    merged = dict(case)
    merged["error"] = "; ".join(sorted({g["error"] for g in gathered if g["error"]}))
    merged["traceback"] = next((g.get("traceback", "") for g in gathered if g["error"]), "")
    for key in ("fwd_err", "weight_err", "moved", "shards"):
        values = [g[key] for g in gathered if key in g]
        merged[key] = max(values) if values else None
    return merged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True, help="JSON list of case objects")
    parser.add_argument("--out", required=True, help="where rank 0 writes the JSON results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # A rank that fails mid-case leaves the others in a collective: time out instead of hanging.
    # The conformance suite names the collective backend of the device under test (it never imports us here).
    backend = os.environ.get("TORCHREC_ASCEND_CONFORMANCE_BACKEND", "gloo")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    pg = dist.group.WORLD
    results = []
    for case in json.loads(args.cases):
        results.append(run_case(case, pg))
        gc.collect()  # free each case's sharded modules (and their DDP/comm threads) while the group is alive
    if dist.get_rank() == 0:
        # Read what torch's entry point left in sys.modules, without importing anything of the plugin.
        autoload = sys.modules.get("torchrec_ascend.injection.autoload")
        state = autoload.STATUS.state if autoload is not None else "not loaded"
        info = {"plugin_state": state, "argv": sys.argv, "pid": os.getpid(), "backend": backend}
        with open(args.out, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=1)
    dist.barrier()  # no rank tears down its connections while another still talks to it
    dist.destroy_process_group()
    # Results are written; finalization with torch's communication threads alive can abort ("terminate called
    # without an active exception") after the work is done, so end here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

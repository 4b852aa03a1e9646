"""Hash tables sharded by DistributedModelParallel vs. the unsharded hash module vs. a plain-Python model.

Run with torchrun (see ``conformance_tests/launch.py``); each case is
``{"kind": "ebc"|"ec", "sharding_type": ..., "optimizer": "sgd"|"adagrad"|"rowwise_adagrad"|"adam"|
"partial_rowwise_adam", "kernel": "fused"}``,
optionally ``"dedup": "index_dedup"`` (an EmbeddingCollection sharded with ``use_index_dedup=True``) or
``"variant"``: ``"mean"`` (MEAN pooling), ``"weighted"`` (per-sample weights), ``"int32"`` (int32 IDs below 2**31,
lengths int32) or ``"eval"`` (after training, eval-mode forwards under ``torch.no_grad()`` with IDs never trained,
which read the not-admitted vector; both oracles run in eval too).
Raw 63-bit IDs (with repeats) go through stock collections of :class:`HashEmbeddingBagConfig` /
:class:`HashEmbeddingConfig` tables; the dedup cases use small IDs instead, chosen so that each user ID equals an
item ID plus the user table's ``num_embeddings`` (linearizing IDs by table size, as fbgemm's dedup does, would merge
them). Three models train on the same batches:

* the sharded one (stock planner constrained to the sharding type; optimizer fused into backward);
* the unsharded hash collection on the global batch (optimizer applied in backward, as TorchRec does unsharded);
* a dict ``ID -> row`` with the same deterministic initialisation and the optimizer written out in Python.

The sharded model and its batches live on the suite's device (``launch.script_device()``); the oracles stay on
the CPU. Reported per case: the largest forward difference to each oracle over all steps, the largest difference of
every ID's final row (gathered from all shards) to each oracle, where the sharded model's tensors lived, and on the
emulated NPU the copies and syncs of its per-batch parts (``runner.count_transfers``).

A case with ``"state_dict": <sharding type>`` instead checks the stock checkpoint path: train, save
``state_dict()`` and the fused optimizer's with torch.distributed.checkpoint, load them into the model sharded the
given way, train both on. Reported: ``load_error`` (a refused load's message), ``fwd_err`` and ``row_err`` against
the model that never stopped, and ``shape_errors``: each entry of the saved state_dicts whose rows are not the
table's ``num_embeddings`` (the not-admitted row must stay hidden).

A case with ``"promise": "reused_row"`` checks that an ID taking over an evicted ID's row trains as a new row (FUSED
or KEY_VALUE, row-wise Adagrad): see ``plugin/reused_rows.py``; ``"promise": "policy_steps"``, that a table read by
two features takes one policy step per batch: see ``plugin/policy_steps.py``; ``"promise": "cadence"``, that
``eviction_cadence`` decides when a pool evicts, how much and which rows it protects: see ``plugin/cadence.py``;
``"promise": "admission"``, that a rejected ID reads ``not_admitted_value`` and gets no row: see
``plugin/admission.py``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torchrec
import torchrec.optim as trec_optim
from torch.distributed.checkpoint.api import CheckpointException
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import ParameterConstraints
from torchrec.modules.embedding_configs import PoolingType
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, HashEmbeddingConfig, get_default_hybrid_sharders
from torchrec_ascend.conformance_tests.launch import script_device
from torchrec_ascend.conformance_tests.plugin import admission, cadence, policy_steps, reused_rows
from torchrec_ascend.conformance_tests.plugin.runner import (
    count_transfers,
    main,
    planned,
    residency,
    shared_directory,
)
from torchrec_ascend.conformance_tests.stock.sharding_matrix import SPARSE_ORACLES, ColumnShardRowWiseAdagrad
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.walk import sharded_kernels
from torchrec_ascend.native import reference

DIM = 16
TABLES = [("user", 64, 3), ("item", 48, 5)]  # name, capacity, init seed
IDS_PER_FEATURE = 24  # distinct IDs each feature draws from (fits every shard's capacity)
BATCH, STEPS, MAX_LEN, LR, EPS = 4, 8, 3, 0.1, 1e-8
INIT = (-0.25, 0.25)


def make_module(kind: str, variant: str = "") -> torch.nn.Module:
    if kind == "ec":
        return torchrec.EmbeddingCollection(tables=[
            HashEmbeddingConfig(name=n, num_embeddings=c, embedding_dim=DIM, feature_names=[f"f_{n}"], init_seed=s,
                                weight_init_min=INIT[0], weight_init_max=INIT[1])
            for n, c, s in TABLES
        ])
    return torchrec.EmbeddingBagCollection(tables=[
        HashEmbeddingBagConfig(name=n, num_embeddings=c, embedding_dim=DIM, feature_names=[f"f_{n}"], init_seed=s,
                               weight_init_min=INIT[0], weight_init_max=INIT[1],
                               pooling=PoolingType.MEAN if variant == "mean" else PoolingType.SUM)
        for n, c, s in TABLES
    ], is_weighted=variant == "weighted")


def id_pool(table_index: int, colliding: bool = False, fresh: bool = False, high: int = 2**63 - 1) -> torch.Tensor:
    """The IDs a feature draws from; ``fresh``: as many others, never in the training pool (eval's unknown IDs)."""
    if colliding:  # user IDs 64.., item IDs 0..: user k + 64 and item k share a linearized index
        return torch.arange(IDS_PER_FEATURE) + (TABLES[0][1] if table_index == 0 else 0)
    gen = torch.Generator().manual_seed(77 + table_index)
    return torch.randint(0, high, (2 if fresh else 1, IDS_PER_FEATURE), generator=gen)[-1]


def make_batch(step: int, rank: int, colliding: bool = False, variant: str = "") -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    lengths = torch.randint(0, MAX_LEN + 1, (len(TABLES) * BATCH,), generator=gen)
    high = 2**31 - 1 if variant == "int32" else 2**63 - 1
    values = []
    for t in range(len(TABLES)):
        n = int(lengths[t * BATCH:(t + 1) * BATCH].sum())
        pool = id_pool(t, colliding, high=high)
        if variant == "eval" and step >= STEPS:  # eval batches: half the IDs never trained
            pool = torch.cat([pool, id_pool(t, fresh=True)])
        values.append(pool[torch.randint(0, pool.numel(), (n,), generator=gen)])
    index = torch.int32 if variant == "int32" else torch.int64
    weights = torch.rand(int(lengths.sum()), generator=gen) if variant == "weighted" else None
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{n}" for n, _, _ in TABLES], values=torch.cat(values).to(index), lengths=lengths.to(index),
        weights=weights,
    )


def rank_batches(step: int, world: int, colliding: bool = False, variant: str = "") -> List[KeyedJaggedTensor]:
    return [make_batch(step, r, colliding, variant) for r in range(world)]


def concat(batches: List[KeyedJaggedTensor]) -> KeyedJaggedTensor:
    keys = batches[0].keys()
    lengths = [b.lengths()[f * BATCH:(f + 1) * BATCH] for f in range(len(keys)) for b in batches]
    values = [b[k].values() for k in keys for b in batches]
    weights = [b[k].weights() for k in keys for b in batches] if batches[0].weights_or_none() is not None else None
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths),
                                               weights=torch.cat(weights) if weights else None)


def rows_of(kind: str, out: Any, batch: KeyedJaggedTensor) -> List[torch.Tensor]:
    """Per sample (ebc) or per value (ec) output rows, features in sorted order, as a list of [n, DIM] blocks."""
    if kind == "ec":
        return [out[k].values() for k in sorted(out.keys())]
    per_key = out.to_dict()
    return [per_key[k] for k in sorted(per_key)]


def split_global(kind: str, blocks: List[torch.Tensor], batches: List[KeyedJaggedTensor], rank: int) -> torch.Tensor:
    keys = sorted(batches[0].keys())
    parts = []
    for key, block in zip(keys, blocks):
        sizes = [BATCH] * len(batches) if kind == "ebc" else [int(b[key].lengths().sum()) for b in batches]
        parts.append(torch.split(block, sizes)[rank])
    return torch.cat(parts, dim=1 if kind == "ebc" else 0)


def upstream(kind: str, rows: torch.Tensor, step: int, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(rows.shape, generator=gen)


class DictModel:
    """The oracle written out: ID -> row (same initialisation), SUM or MEAN pooling of (weighted) rows, the optimizer
    in plain Python; in eval (``training`` False) an ID never trained reads the not-admitted vector (zeros)."""

    def __init__(self, optimizer: str, block: int, mean: bool = False) -> None:
        self.rows: Dict[Tuple[str, int], torch.Tensor] = {}
        self.state: Dict[Tuple[str, int], torch.Tensor] = {}
        self.optimizer, self.block, self.mean = optimizer, block, mean
        self.steps = 0  # training steps: Adam's bias correction counts the table's steps, not the row's
        self.seeds = {f"f_{n}": (n, s) for n, _, s in TABLES}
        self.training = True

    def row(self, feature: str, id_: int) -> torch.Tensor:
        table, seed = self.seeds[feature]
        key = (table, id_)
        if key not in self.rows and not self.training:
            return torch.zeros(DIM)
        if key not in self.rows:
            self.rows[key] = reference.hash_uniform_init(torch.tensor([id_]), seed, DIM, *INIT)[0].clone()
        return self.rows[key]

    def forward(self, kind: str, batch: KeyedJaggedTensor) -> List[torch.Tensor]:
        blocks = []
        for key in sorted(batch.keys()):
            jt = batch[key]
            ids = jt.values().tolist()
            if kind == "ec":
                blocks.append(torch.stack([self.row(key, i) for i in ids]) if ids else torch.zeros(0, DIM))
            else:
                weights = jt.weights().tolist() if jt.weights_or_none() is not None else [1.0] * len(ids)
                out, start = [], 0
                for length in jt.lengths().tolist():
                    bag = zip(ids[start:start + length], weights[start:start + length])
                    start += length
                    pooled = sum((w * self.row(key, i) for i, w in bag), torch.zeros(DIM))
                    out.append(pooled / length if self.mean and length else pooled)
                blocks.append(torch.stack(out))
        return blocks

    def backward(self, kind: str, batch: KeyedJaggedTensor, grads: List[torch.Tensor], scale: float) -> None:
        acc: Dict[Tuple[str, int], torch.Tensor] = {}
        for key, grad in zip(sorted(batch.keys()), grads):
            jt = batch[key]
            ids = jt.values().tolist()
            per_value = grad if kind == "ec" else torch.repeat_interleave(grad, jt.lengths().long(), dim=0)
            if kind == "ebc" and self.mean:
                per_value = per_value / torch.repeat_interleave(jt.lengths().long(), jt.lengths().long()).unsqueeze(1)
            if jt.weights_or_none() is not None:
                per_value = per_value * jt.weights().unsqueeze(1)
            table = self.seeds[key][0]
            for i, g in zip(ids, per_value):
                acc[(table, i)] = acc.get((table, i), torch.zeros(DIM)) + g * scale
        self.steps += 1
        for key, g in acc.items():
            self._update(key, g)

    def _adam(self, key: Tuple[str, int], g: torch.Tensor) -> None:
        """fbgemm's ADAM (betas 0.9, 0.999, decoupled weight decay 0), written out; PARTIAL_ROWWISE_ADAM keeps the
        second moment per row (per column block of a column shard)."""
        beta1, beta2, step = 0.9, 0.999, self.steps
        blocks = DIM // self.block
        rowwise = self.optimizer == "partial_rowwise_adam"
        m, v = self.state.setdefault(key, torch.zeros(2, DIM)).unbind(0)
        m.mul_(beta1).add_((1 - beta1) * g)
        square = (g * g).view(blocks, self.block).mean(dim=1).repeat_interleave(self.block) if rowwise else g * g
        v.mul_(beta2).add_((1 - beta2) * square)
        self.rows[key] -= LR * (m / (1 - beta1 ** step)) / ((v / (1 - beta2 ** step)).sqrt() + EPS)

    def _update(self, key: Tuple[str, int], g: torch.Tensor) -> None:
        if self.optimizer in ("adam", "partial_rowwise_adam"):
            self._adam(key, g)
            return
        if self.optimizer == "sgd":
            self.rows[key] -= LR * g
            return
        if self.optimizer == "adagrad":
            state = self.state.setdefault(key, torch.zeros(DIM))
            state += g * g
            self.rows[key] -= LR * g / (state.sqrt() + EPS)
            return
        blocks = DIM // self.block
        state = self.state.setdefault(key, torch.zeros(blocks))
        state += (g * g).view(blocks, self.block).mean(dim=1)
        std = (state.sqrt() + EPS).repeat_interleave(self.block)
        self.rows[key] -= LR * g / std


OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": LR}),
    "adagrad": (torch.optim.Adagrad, {"lr": LR, "eps": EPS}),
    "rowwise_adagrad": (trec_optim.RowWiseAdagrad, {"lr": LR, "eps": EPS}),
    "adam": (torch.optim.Adam, {"lr": LR, "eps": EPS}),
    "partial_rowwise_adam": (trec_optim.PartialRowWiseAdam, {"lr": LR, "eps": EPS}),
}


def shard(
    module: torch.nn.Module, sharding_type: str, kernel: str, pg: Any, dedup: bool = False
) -> DistributedModelParallel:
    constraints = {
        n: ParameterConstraints(sharding_types=[sharding_type], compute_kernels=[kernel], min_partition=8)
        for n, _, _ in TABLES
    }
    return planned(module, constraints, pg, get_default_hybrid_sharders(use_index_dedup=dedup))


def sharded_rows(dmp: torch.nn.Module, pg: Any) -> Dict[Tuple[str, int], torch.Tensor]:
    """Every (table, ID) -> full row, assembled from all ranks' shards (column shards concatenated)."""
    local = []
    for kernel in sharded_kernels(dmp):
        if isinstance(kernel, HashRows):
            for t, name in enumerate(kernel._table_names):
                ids, rows, col0 = kernel.export_rows(t)
                local.append((name, ids.tolist(), rows.cpu(), col0))
    gathered: List[Any] = [None] * pg.size()
    dist.all_gather_object(gathered, local, group=pg)
    pieces: Dict[Tuple[str, int], Dict[int, torch.Tensor]] = {}
    for rank_parts in gathered:
        for name, ids, rows, col0 in rank_parts:
            for i, row in zip(ids, rows):
                pieces.setdefault((name, i), {})[col0] = row
    return {key: torch.cat([cols[c] for c in sorted(cols)]) for key, cols in pieces.items()}


def unsharded_rows(module: torch.nn.Module, kind: str) -> Dict[Tuple[str, int], torch.Tensor]:
    lookups = module.embeddings if kind == "ec" else module.embedding_bags
    out = {}
    for name, lookup in lookups.items():
        ids, slots = lookup.slots.id_map.export()
        for i, s in zip(ids.tolist(), slots.tolist()):
            out[(name, i)] = lookup.weight[s].detach()
    return out


def max_row_diff(a: Dict[Any, torch.Tensor], b: Dict[Any, torch.Tensor]) -> float:
    if set(a) != set(b):
        return float("inf")
    return max((a[k] - b[k]).abs().max().item() for k in a) if a else 0.0


def state_dict_case(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    """Train, save ``state_dict()`` and the fused optimizer's with DCP, load both into a model sharded
    ``case["state_dict"]``, train both on: the outputs and final rows must agree."""
    rank, world = pg.rank(), pg.size()
    opt_cls, opt_kwargs = OPTIMIZERS[case["optimizer"]]

    def build(sharding_type: str) -> DistributedModelParallel:
        kernel = "dense" if sharding_type == "data_parallel" else "fused"  # replicas: weights untrained here
        return shard(_with_optimizer(make_module(case["kind"]), case["kind"], opt_cls, opt_kwargs), sharding_type,
                     kernel, pg)

    def train(model: DistributedModelParallel, step: int) -> torch.Tensor:
        batch = rank_batches(step, world)[rank].to(script_device())
        out = torch.cat(rows_of(case["kind"], model(batch), batch), dim=1 if case["kind"] == "ebc" else 0)
        (out * upstream(case["kind"], out, step, rank).to(out.device)).sum().backward()
        where.update(residency(parameters=model, optimizer=model.fused_optimizer, inputs=batch, outputs=out))
        return out.detach().cpu()

    where: Dict[str, Any] = {}
    saved = build(case["sharding_type"])
    for step in range(STEPS // 2):
        train(saved, step)
    error = ""
    with shared_directory("state-dict-", pg) as directory:
        saved_state = {"model": saved.state_dict(), "optim": saved.fused_optimizer.state_dict()}
        shape_errors = _not_table_sized(saved_state, case["kind"])
        dcp.save(saved_state, checkpoint_id=directory)
        loaded = build(case["state_dict"])
        state = {"model": loaded.state_dict(), "optim": loaded.fused_optimizer.state_dict()}
        try:  # DCP refuses a load onto more shards than were saved: no policy state for the new ones
            dcp.load(state, checkpoint_id=directory)
        except CheckpointException as err:
            error = str(err)
    try:
        if not error:
            loaded.load_state_dict(state["model"])
            loaded.fused_optimizer.load_state_dict(state["optim"])
    except ConfigError as err:
        error = str(err)
    errors: List[Any] = [None] * world
    dist.all_gather_object(errors, error, group=pg)
    if any(errors):  # no rank trains on alone
        return {"load_error": next(e for e in errors if e)}
    fwd_err = max((train(saved, s) - train(loaded, s)).abs().max().item() for s in range(STEPS // 2, STEPS))
    return {"load_error": "", "fwd_err": fwd_err, "residency": where, "shape_errors": shape_errors,
            "row_err": max_row_diff(sharded_rows(saved, pg), sharded_rows(loaded, pg))}


def _not_table_sized(state: Dict[str, Any], kind: str) -> List[str]:
    """Each tensor of ``state`` (a model's and its fused optimizer's state_dict) holding a hash table's rows whose
    first dimension is not the table's ``num_embeddings`` (a multiple, for row-wise states), as ``"<key>: <size>"``."""
    prefix = "embeddings" if kind == "ec" else "embedding_bags"
    rows = {f"{prefix}.{name}.weight": capacity for name, capacity, _ in TABLES}
    entries = [(key, state["model"][key]) for key in rows if key in state["model"]]
    entries += [(f"{key} {name}", value) for key in rows for name, value in state["optim"]["state"].get(key, {}).items()
                if isinstance(value, torch.Tensor) and value.dim() > 0 and not name.endswith(".iter")]
    if len(entries) < len(rows):
        return [f"the model's state_dict holds {len(entries)} of the {len(rows)} tables' weights"]
    def table_sized(key: str, value: torch.Tensor) -> bool:
        table_rows = rows[key.split(" ")[0]]
        # A row-wise state of a column-wise table holds each column shard's rows one after the other (TorchRec's).
        return value.size(0) % table_rows == 0 if value.dim() == 1 else value.size(0) == table_rows

    return [f"{key}: {tuple(value.size())}" for key, value in entries if not table_sized(key, value)]


def run_case(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    if "state_dict" in case:
        return state_dict_case(case, pg)
    if case.get("promise") == "reused_row":
        return reused_rows.run(case, pg)
    if case.get("promise") == "policy_steps":
        return policy_steps.run(case, pg)
    if case.get("promise") == "cadence":
        return cadence.run(case, pg)
    if case.get("promise") == "admission":
        return admission.run(case, pg)
    rank, world = pg.rank(), pg.size()
    kind, sharding_type, variant = case["kind"], case["sharding_type"], case.get("variant", "")
    opt_cls, opt_kwargs = OPTIMIZERS[case["optimizer"]]
    dedup = case.get("dedup") == "index_dedup"
    torch.manual_seed(0)
    dmp = shard(_with_optimizer(make_module(kind, variant), kind, opt_cls, opt_kwargs), sharding_type,
                case.get("kernel", "dense" if sharding_type == "data_parallel" else "fused"), pg, dedup)
    # data_parallel tables are trained by a dense optimizer, as TorchRec users do (DDP averages their gradients).
    dense_params = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    dense = KeyedOptimizerWrapper(dense_params, lambda ps: opt_cls(ps, **opt_kwargs)) if dense_params else None
    block = _column_block(dmp) or DIM
    if opt_cls is trec_optim.RowWiseAdagrad and block != DIM:
        opt_cls, opt_kwargs = ColumnShardRowWiseAdagrad, {**opt_kwargs, "block": block}
    if case["optimizer"] in SPARSE_ORACLES and sharding_type != "data_parallel":  # Adam: touched rows only
        opt_cls, extra = SPARSE_ORACLES[case["optimizer"]]
        opt_kwargs = {**opt_kwargs, **extra, **({"block": block} if extra.get("rowwise") else {})}
    unsharded = _with_optimizer(make_module(kind, variant), kind, opt_cls, opt_kwargs)
    python = DictModel(case["optimizer"], block, mean=variant == "mean")
    scale = 1.0 / world  # TorchRec averages embedding gradients over ranks

    err_unsharded = err_python = 0.0
    device, transfers = script_device(), count_transfers(dmp)
    for step in range(STEPS + (2 if variant == "eval" else 0)):
        if step == STEPS:  # eval: the trained models, forward only under no_grad, unknown IDs included
            dmp.eval(), unsharded.eval()
            python.training = False
        batches = rank_batches(step, world, dedup, variant)
        with torch.set_grad_enabled(step < STEPS):
            ref_blocks = rows_of(kind, unsharded(concat(batches)), concat(batches))
            py_blocks = python.forward(kind, concat(batches))
            local = batches[rank].to(device)
            mine = torch.cat(rows_of(kind, dmp(local), local), dim=1 if kind == "ebc" else 0)
        on_host = mine.detach().cpu()
        err_unsharded = max(err_unsharded, (on_host - split_global(kind, ref_blocks, batches, rank)).abs().max().item())
        err_python = max(err_python, (on_host - split_global(kind, py_blocks, batches, rank)).abs().max().item())

        if step >= STEPS:
            continue
        (mine * upstream(kind, mine, step, rank).to(device)).sum().backward()
        if dense is not None:
            dense.step()
            dense.zero_grad()
        grads = [upstream(kind, split_global(kind, ref_blocks, batches, r), step, r) for r in range(world)]
        ref_total = sum((split_global(kind, ref_blocks, batches, r) * g).sum() for r, g in enumerate(grads))
        (ref_total * scale).backward()
        python.backward(kind, concat(batches), _global_grads(kind, grads, batches), scale)

    final = sharded_rows(dmp, pg)
    seen = {(n, i) for step in range(STEPS) for (n, _, _), f in zip(TABLES, range(len(TABLES)))
            for i in concat(rank_batches(step, world, dedup, variant))[f"f_{n}"].values().tolist()}
    return {
        "fwd_err_unsharded": err_unsharded,
        "fwd_err_python": err_python,
        "row_err_unsharded": max_row_diff(final, unsharded_rows(unsharded, kind)),
        "row_err_python": max_row_diff(final, python.rows),
        "ids": len(final),
        "expected_ids": len(seen),
        "index_dedup": any(getattr(m, "_use_index_dedup", False) for m in dmp.modules()),
        "residency": residency(parameters=dmp, optimizer=[dmp.fused_optimizer, dense], inputs=local, outputs=mine),
        "transfers": transfers,
    }


def _global_grads(kind: str, grads: List[torch.Tensor], batches: List[KeyedJaggedTensor]) -> List[torch.Tensor]:
    """Per-feature gradient blocks in global-batch order, from the per-rank [rows, features*DIM] gradients."""
    keys = sorted(batches[0].keys())
    out = []
    for f in range(len(keys)):
        per_rank = []
        for r, g in enumerate(grads):
            if kind == "ebc":
                per_rank.append(g[:, f * DIM:(f + 1) * DIM])
            else:
                sizes = [int(batches[r][k].lengths().sum()) for k in keys]
                per_rank.append(torch.split(g, sizes)[f])
        out.append(torch.cat(per_rank))
    return out


def _with_optimizer(module: torch.nn.Module, kind: str, cls: Any, kwargs: Dict[str, Any]) -> torch.nn.Module:
    lookups = module.embeddings if kind == "ec" else module.embedding_bags
    apply_optimizer_in_backward(cls, [lookup.weight for lookup in lookups.values()], dict(kwargs))
    return module


def _column_block(dmp: Any) -> Any:
    widths = [
        shard.shard_sizes[1]
        for ps in dmp.plan.plan[""].values()
        for shard in getattr(ps.sharding_spec, "shards", None) or []
        if shard.shard_sizes[1] < DIM
    ]
    return min(widths) if widths else None


if __name__ == "__main__":
    main(__doc__, run_case, worst=("fwd_err_unsharded", "fwd_err_python", "row_err_unsharded", "row_err_python",
                                   "fwd_err", "row_err"))

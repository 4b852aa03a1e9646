"""Checkpoints of hash and KEY_VALUE tables: round trips, increments and resharding vs. a model that never stopped.

Run with torchrun (``conformance_tests/launch.py``). The model: two hash tables (``user``, ``item``; FUSED or
KEY_VALUE) and a plain KEY_VALUE table (``plain``), in an EmbeddingBagCollection (``ebc``) or EmbeddingCollection
(``ec``), trained on global batches of ``GLOBAL_BATCH`` samples split evenly over the ranks, each rank's loss scaled by
the world size, so the updates do not depend on the world size. Every KEY_VALUE shard has a tiny cache and host
budget: rows live in all three tiers. A case is one of:

* ``{"action": "save", "dir": D, "kind", "sharding_type", "kernel", "optimizer", "policy"}``: trains, saving a full
  checkpoint and two increments to ``D/ckpt`` on the way, trains on (the model that never stopped), and writes what
  it saw to ``D/reference.pt``.
* ``{"action": "load", "dir": D, "sharding_type", "kernel", "world_size"}``: builds ``D``'s model on the first
  ``world_size`` ranks with that layout and kernel for the hash tables, loads ``D/ckpt``, and trains on.
* ``{"action": "round_trip", <save fields>, "load_sharding_type", "load_kernel", "load_world_size"}``: both, in a
  temporary directory (what the conformance suite runs; :func:`conformance_cases`).
* ``{"action": "gone_ids", ...}``: an ID that leaves a shard between a full and an incremental save stays gone after
  the chain is loaded, same layout and resharded (``plugin/gone_ids.py``).
* ``{"action": "dense"}``: the two checkpoint paths together: a dense layer over a FUSED hash table and a plain FUSED
  table, the hash table through the Saver, the rest through torch.distributed.checkpoint with
  :func:`~torchrec_ascend.checkpoint.dense_state_dict`, loaded into a model with other dense weights. Reports
  ``dense_err`` (outputs vs. the saved model's) and the state_dict keys each path took.

* ``{"action": "dcp", <round_trip fields>}``: the same round trip through stock ``torch.distributed.checkpoint``
  only: ``dcp.save({"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()})`` after the saves' steps,
  then ``dcp.load`` into the second model and ``load_state_dict`` of both (KEY_VALUE tables stream through windows of
  their rows; hash tables' policy state travels in the optimizer's state_dict). ``expect`` is ``"refused"`` where
  the load must be refused (IDs on shards that do not own them): reported as ``load_error``, with ``unchanged``
  (the loaded model's rows are still its own). With ``"load_dim"``, ``"load_optimizer"`` or ``"load_capacity"``
  the second model has another ``embedding_dim``, optimizer or ``num_embeddings``: its load must be refused naming a
  table's key, the model unchanged. With ``"damage"`` (:data:`DAMAGES`) the save or the load is damaged by hand (part
  of a table, an ID twice, a file cut short, a damaged ``policy_state``, rows without their IDs, FUSED IDs onto
  shards that do not own them): refused naming the table, KEY_VALUE tables unchanged (:func:`refused_cases`).
* A ``round_trip`` case with ``"damage"`` (``flipped_byte``, ``host_memory``) damages the last rank's part of a
  Saver load: every rank must refuse it, the model unchanged (:func:`refused_load`; with ``"load_into":
  "fresh_model"`` the model has not trained, so its KEY_VALUE tiers are empty: the other ranks store the rows as
  they read them and must empty those tiers again); with ``"load_capacity"`` it loads into hash tables of another
  ``num_embeddings`` and trains on like the model that never stopped.

``policy`` is ``"default"`` (admit all; FUSED tables never full) or ``"evict"`` (FUSED hash tables a fifth of the
IDs in size: LFU eviction and count admission at work; use it with an unchanged layout).

Reported: ``rows_err``, the largest difference of any (table, ID) row right after loading from the rows at the last
save (inf when the ID sets differ); ``fwd_err`` / ``final_err``, the largest difference of the outputs while
training on and of the final rows from the model that never stopped; ``stats_err`` (unchanged layout), the largest
difference of the summed hash-table counters; ``exact``, whether every shard was restored with its layout
unchanged; ``ids``, the IDs restored; ``residency``, where the loaded model's tensors lived (the suite's device).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional, Tuple
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torchrec
from torch.distributed.checkpoint.api import CheckpointException
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import ParameterConstraints
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, HashEmbeddingConfig
from torchrec_ascend.checkpoint import Saver, dense_state_dict, restore
from torchrec_ascend.checkpoint.key_value_state import settle_loads
from torchrec_ascend.checkpoint.saver import local_shards
from torchrec_ascend.checkpoint.stock import saver_keys
from torchrec_ascend.checkpoint.versions import resolve_chain
from torchrec_ascend.conformance_tests.launch import script_device
from torchrec_ascend.conformance_tests.plugin import gone_ids
from torchrec_ascend.conformance_tests.plugin.hash_tables import OPTIMIZERS, rows_of
from torchrec_ascend.conformance_tests.plugin.runner import (
    first_ranks,
    key_value_options,
    main,
    planned,
    residency,
    shared_directory,
)
from torchrec_ascend.errors import CapacityError, ConfigError, StorageError

DIM = 16
HASH_TABLES = [("user", 3), ("item", 5)]  # name, init seed
CAPACITY = {"default": 512, "evict": 64}  # rows per hash table: all IDs at 1 rank / a fifth of them
PLAIN_ROWS = 64
POOL = 300  # distinct IDs per hash feature
GLOBAL_BATCH, MAX_LEN = 8, 3  # at most 24 IDs per feature per step: every cache below holds a batch
CACHE_ROWS, HOST_KB = 24, 8
SAVES = (2, 2, 1)  # steps before the full save, the first increment, the second increment
CONTINUE = 3  # steps trained after the last save
LR, EPS = 0.1, 1e-8
INIT = 0.05  # new hash rows are uniform in [-INIT, INIT)
RESHARD_TOLERANCE = 1e-5  # float summation order changes with the layout; an unchanged layout is bit for bit
FEATURES = [f"f_{name}" for name, _ in HASH_TABLES] + ["f_plain"]


# -- the suite's protocol ----------------------------------------------------------------------------------------------


def conformance_cases(world_size: int, quick: bool) -> List[Dict[str, Any]]:
    """Self-contained round trips at ``world_size`` ranks: unchanged layouts (bit for bit, policies included) and
    resharding (another sharding type, kernel, and for 2+ ranks a single rank)."""
    spread = "row_wise" if world_size > 1 else "table_wise"
    cases = [
        round_trip_case("ebc", spread, "key_value", "adagrad", "default", spread, "key_value", world_size),
        round_trip_case("ebc", spread, "fused", "rowwise_adagrad", "evict", spread, "fused", world_size),
        round_trip_case("ebc", "column_wise", "fused", "adagrad", "default", "table_wise", "key_value", 1),
        round_trip_case("ec", spread, "key_value", "sgd", "default", "table_wise", "fused", world_size),
    ]
    gone = {"action": "gone_ids", "kind": "ebc", "sharding_type": spread, "kernel": "fused", "load_world_size": 1}
    stock = [
        dcp_case("ebc", spread, "key_value", "rowwise_adagrad", spread, "key_value", world_size),
        dcp_case("ec", spread, "key_value", "adagrad", "table_wise", "key_value", 1),
        dcp_case("ebc", spread, "fused", "adagrad", spread, "fused", world_size, policy="evict"),
    ]
    if world_size > 1:
        stock += [dcp_case("ebc", "row_wise", "key_value", "adagrad", "row_wise", "fused", world_size),
                  dcp_case("ebc", "table_wise", "key_value", "rowwise_adagrad", "row_wise", "key_value", world_size,
                           expect="refused")]
    stock += [dcp_case("ebc", spread, "key_value", "adam", spread, "key_value", world_size),
              dcp_case("ebc", spread, "key_value", "rowwise_adagrad", spread, "key_value", world_size,
                       expect="mismatch", load_dim=2 * DIM),
              dcp_case("ebc", spread, "key_value", "rowwise_adagrad", spread, "key_value", world_size,
                       expect="mismatch", load_optimizer="adagrad")]
    adam = round_trip_case("ebc", spread, "key_value", "adam", "default", spread, "key_value", world_size)
    return cases[1:3] + [gone] + stock[:2] if quick else (
        cases + [adam, {"action": "dense"}, gone] + stock + refused_cases(world_size))


def refused_cases(world_size: int) -> List[Dict[str, Any]]:
    """Loads that must be refused naming the table, KEY_VALUE tables left as they were (:data:`DAMAGES`,
    :func:`refused_load`), and a Saver load into another capacity."""
    spread = "row_wise" if world_size > 1 else "table_wise"
    key_value = [dcp_case("ebc", spread, "key_value", "rowwise_adagrad", spread, "key_value", world_size,
                          expect="refused", damage=damage) for damage in ("id_twice", "policy_state")]
    key_value.append(dcp_case("ebc", spread, "key_value", "rowwise_adagrad", spread, "key_value", world_size,
                              expect="reloaded", damage="cut_short"))
    key_value += [  # hash tables table_wise: the plain table is row_wise, a window on every rank
        dcp_case("ebc", "table_wise", "key_value", "rowwise_adagrad", "table_wise", "key_value", world_size,
                 expect="refused", damage="part_of_a_table"),
        dcp_case("ebc", spread, "key_value", "rowwise_adagrad", spread, "key_value", world_size, expect="mismatch",
                 load_capacity=CAPACITY["default"] // 2)]
    fused = [dcp_case("ebc", spread, "fused", "adagrad", spread, "fused", world_size, expect="refused",
                      damage="rows_without_ids")]
    if world_size > 1:  # IDs placed by one shard's slots, loaded into row ranges placed by hash(ID) % world
        fused.append(dcp_case("ebc", "table_wise", "fused", "rowwise_adagrad", "row_wise", "fused", world_size,
                              expect="refused", damage="model_only"))
    saver = [{**round_trip_case("ebc", spread, "key_value", "adagrad", "default", spread, "key_value", world_size),
              "damage": damage} for damage in ("flipped_byte", "host_memory")]
    saver.append({**saver[0], "load_into": "fresh_model"})
    saver.append({**round_trip_case("ebc", spread, "fused", "adagrad", "default", spread, "fused", world_size),
                  "load_capacity": CAPACITY["default"] // 2})
    return key_value + fused + saver


def check_result(result: Dict[str, Any]) -> None:
    """Raise AssertionError saying what differs (see the module docstring for the fields)."""
    assert not result.get("error"), result.get("traceback") or result["error"]
    if result["action"] == "dense":
        assert result["dense_err"] == 0.0, f"outputs after loading both paths differ by {result['dense_err']}"
        assert result["saver_keys"] == ["ebc.embedding_bags.user.weight", "ebc.embedding_bags.user.weight_id"], (
            result["saver_keys"])
        assert {"dense.weight", "dense.bias", "ebc.embedding_bags.plain.weight"} == set(result["dcp_keys"])
        return
    if result["action"] == "gone_ids":  # no resurrection from the full save (plugin/gone_ids.py)
        assert result["gone"] > 0 and result["save_kinds"] == ["full", "incremental"], (
            f"{result['gone']} IDs left the shards between saves {result['save_kinds']}: the case proves nothing")
        for load in ("same", "resharded"):
            assert result[f"{load}_resurrected"] == 0 and result[f"{load}_lost"] == 0, (
                f"loading the chain ({load} layout) holds {result[f'{load}_resurrected']} IDs the model did not hold "
                f"at the incremental save (IDs that left after the full save came back) and lacks "
                f"{result[f'{load}_lost']} it held")
            assert result[f"{load}_rows_err"] == 0.0, (
                f"rows loaded ({load} layout) differ from the saved ones by {result[f'{load}_rows_err']}")
        return
    if result["action"] == "save":
        assert result["saved_ids"] > 0, "the save case trained no IDs"
        return
    if result.get("expect") == "mismatch":  # another embedding_dim or optimizer: DCP refuses, naming a table's key
        error = result["load_error"]
        assert error and any(f"{table}." in error for table in ("user", "item", "plain")), (
            f"a checkpoint of another embedding_dim or optimizer must be refused naming a table's key: {error!r}")
        assert result["unchanged"], "a refused load changed the model"
        return
    if result.get("damage") in SAVER_DAMAGES:  # one rank's problem: every rank refuses, every table as it was
        error, (fragments, what) = result["load_error"], SAVER_DAMAGES[result["damage"]]
        assert result["refused_ranks"] == result["load_world_size"], (
            f"a Saver load with {what} was refused on {result['refused_ranks']} of {result['load_world_size']} "
            f"ranks (a load is all or nothing): {error!r}")
        assert all(f in error for f in fragments), f"a Saver load with {what} must be refused saying {fragments}: " \
            f"{error!r}"
        if result.get("load_into") == "fresh_model":
            what += " into a model that had not trained (its KEY_VALUE tiers empty)"
        assert result["unchanged"], f"a Saver load with {what} was refused but changed the model"
        return
    if result.get("damage") == "cut_short":  # refused, then the intact copy loads as a plain round trip
        assert any(all(f in result["load_error"] for f in fs) for fs in DAMAGES["cut_short"]), (
            f"a dcp.load of a file cut short must fail: {result['load_error']!r}")
        assert result["reload_refusals"] == 0, "loading the intact copy after the failed load was refused"
    elif result.get("expect") == "refused":  # a damaged save or load, or IDs onto shards that do not own them
        error = result["load_error"]
        damage = result.get("damage") or f"misplaced_{result['load_kernel']}"
        alternatives = DAMAGES[damage]
        assert any(all(f in error for f in fragments) for fragments in alternatives), (
            f"a load with {damage} must be refused saying one of {alternatives}: {error!r}")
        if result["load_kernel"] == "key_value":  # FUSED tables are written in place by DCP (module docstring)
            assert result["unchanged"], f"a load with {damage} was refused but changed the KEY_VALUE tables"
        return
    if result["action"] == "dcp" and result.get("damage") != "cut_short":
        assert not result["load_error"], result["load_error"]
    assert result["ids"] > 0, "nothing was restored: the case proves nothing"
    assert result["rows_err"] == 0.0, f"rows right after loading differ from the saved ones by {result['rows_err']}"
    if result["same_layout"]:  # same layout and world size: the same computation as the model that never stopped
        assert result["exact"], "the layout is unchanged but some shard was resharded instead of restored exactly"
        assert result["fwd_err"] == 0.0 and result["final_err"] == 0.0, (
            f"restored with an unchanged layout but training differs from the model that never stopped: outputs by "
            f"{result['fwd_err']}, final rows by {result['final_err']}"
        )
        assert result["stats_err"] == 0.0, f"hash-table counters differ by {result['stats_err']}"
    else:
        assert max(result["fwd_err"], result["final_err"]) <= RESHARD_TOLERANCE, (
            f"resharded, then training differs from the model that never stopped: outputs by {result['fwd_err']}, "
            f"final rows by {result['final_err']} (tolerance {RESHARD_TOLERANCE})"
        )


def dcp_case(kind: str, sharding_type: str, kernel: str, optimizer: str, load_sharding_type: str,
             load_kernel: str, load_world_size: int, expect: str = "loaded", policy: str = "default",
             **mismatch: Any) -> Dict[str, Any]:
    """A ``dcp`` case: a round trip through stock torch.distributed.checkpoint (see the module docstring);
    ``mismatch``: ``load_dim`` or ``load_optimizer`` of the second model."""
    case = round_trip_case(kind, sharding_type, kernel, optimizer, policy, load_sharding_type, load_kernel,
                           load_world_size)
    return {**case, "action": "dcp", "expect": expect, **mismatch}


def round_trip_case(kind: str, sharding_type: str, kernel: str, optimizer: str, policy: str,
                    load_sharding_type: str, load_kernel: str, load_world_size: int) -> Dict[str, Any]:
    """A ``round_trip`` case: save with the first layout, load into the second (see the module docstring)."""
    return {"action": "round_trip", "kind": kind, "sharding_type": sharding_type, "kernel": kernel,
            "optimizer": optimizer, "policy": policy, "load_sharding_type": load_sharding_type,
            "load_kernel": load_kernel, "load_world_size": load_world_size}


# -- the model and its data --------------------------------------------------------------------------------------------


def make_module(kind: str, policy: str, device: torch.device, dim: int = DIM,
                capacity: Optional[int] = None) -> torch.nn.Module:
    options = {"overflow": "evict", "eviction_policy": "lfu", "admission_policy": "count",
               "admission_options": {"threshold": 2}} if policy == "evict" else {}
    hash_cls = HashEmbeddingConfig if kind == "ec" else HashEmbeddingBagConfig
    plain_cls = torchrec.EmbeddingConfig if kind == "ec" else torchrec.EmbeddingBagConfig
    # New rows' range given, not TorchRec's default (+-sqrt(1 / num_embeddings)): a load into another capacity
    # must train on like the model that never stopped.
    tables = [hash_cls(name=n, num_embeddings=capacity or CAPACITY[policy], embedding_dim=dim, feature_names=[f"f_{n}"],
                       init_seed=seed, weight_init_min=-INIT, weight_init_max=INIT, **options)
              for n, seed in HASH_TABLES]
    tables.append(plain_cls(name="plain", num_embeddings=PLAIN_ROWS, embedding_dim=dim, feature_names=["f_plain"]))
    collection = torchrec.EmbeddingCollection if kind == "ec" else torchrec.EmbeddingBagCollection
    return collection(tables=tables, device=device)


def build(spec: Dict[str, Any], sharding_type: str, kernel: str, pg: Any, disk: str) -> DistributedModelParallel:
    """``spec``'s model sharded over ``pg``: hash tables as asked; the plain table KEY_VALUE, row-wise (by row
    ranges) unless the hash tables are (a module cannot mix row-wise hash and plain tables), else table-wise."""
    device = script_device()
    torch.manual_seed(0)  # the plain table's initial rows
    capacity = spec.get("capacity") or CAPACITY[spec["policy"]]
    module = make_module(spec["kind"], spec["policy"], device, spec.get("dim", DIM), capacity)
    lookups = module.embeddings if spec["kind"] == "ec" else module.embedding_bags
    cls, kwargs = OPTIMIZERS[spec["optimizer"]]
    apply_optimizer_in_backward(cls, [lookup.weight for lookup in lookups.values()], dict(kwargs))
    world = pg.size()
    plain_sharding = "table_wise" if sharding_type == "row_wise" else "row_wise"
    constraints = {}
    for name, rows, table_kernel, table_sharding in [
        (n, capacity, kernel, sharding_type) for n, _ in HASH_TABLES
    ] + [("plain", PLAIN_ROWS, "key_value", plain_sharding)]:
        shard_rows = rows // world if table_sharding == "row_wise" else rows
        constraints[name] = ParameterConstraints(
            sharding_types=[table_sharding], compute_kernels=[table_kernel], min_partition=8,
            **key_value_options(table_kernel, min(1.0, CACHE_ROWS / shard_rows), HOST_KB / 1024, disk))
    return planned(module, constraints, pg)


def global_batch(step: int) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    """Per feature, the global batch's lengths ``[GLOBAL_BATCH]`` and values (raw IDs; rows for ``f_plain``)."""
    gen = torch.Generator().manual_seed(7919 * step + 1)
    out = {}
    for t, feature in enumerate(FEATURES):
        lengths = torch.randint(0, MAX_LEN + 1, (GLOBAL_BATCH,), generator=gen)
        n = int(lengths.sum())
        if feature == "f_plain":
            values = torch.randint(0, PLAIN_ROWS, (n,), generator=gen)
        else:
            hot = torch.randint(0, POOL // 8, (n,), generator=gen)  # a hot set and a long tail
            tail = torch.randint(0, POOL, (n,), generator=gen)
            values = torch.where(torch.rand(n, generator=gen) < 0.5, hot, tail) * 1_000_003 + t * 2**40
        out[feature] = (lengths, values)
    return out


def local_part(
    step: int, rank: int, world: int
) -> Tuple[KeyedJaggedTensor, Dict[str, Tuple[Tuple[int, int], Tuple[int, int]]]]:
    """This rank's samples of the global batch, and per feature its range of output rows in the global order."""
    lo, hi = rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world
    lengths, values, ranges = [], [], {}
    for feature, (all_lengths, all_values) in global_batch(step).items():
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), all_lengths.cumsum(0)])
        lengths.append(all_lengths[lo:hi])
        values.append(all_values[int(offsets[lo]):int(offsets[hi])])
        ranges[feature] = (int(offsets[lo]), int(offsets[hi])), (lo, hi)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=torch.cat(values), lengths=torch.cat(lengths))
    return kjt.to(script_device()), ranges


def train_step(model: Any, kind: str, step: int, pg: Any) -> List[torch.Tensor]:
    """One step on this rank's part of the global batch; returns the global outputs, one block per feature."""
    rank, world = pg.rank(), pg.size()
    kjt, ranges = local_part(step, rank, world)
    blocks = rows_of(kind, model(kjt), kjt)
    loss: Any = 0.0
    for feature, block in zip(sorted(FEATURES), blocks):
        (value_lo, value_hi), (sample_lo, sample_hi) = ranges[feature]
        lo, hi, total = (value_lo, value_hi, None) if kind == "ec" else (sample_lo, sample_hi, GLOBAL_BATCH)
        if total is None:
            total = int(global_batch(step)[feature][0].sum())
        gen = torch.Generator().manual_seed(1000 * step + FEATURES.index(feature))
        upstream = torch.randn(total, DIM, generator=gen)[lo:hi].to(block.device)
        loss = loss + (block * upstream).sum()
    (loss * world).backward()  # TorchRec averages embedding gradients over ranks: undo it, for world-free updates
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, [b.detach().cpu() for b in blocks], group=pg)
    return [torch.cat([parts[f] for parts in gathered]) for f in range(len(blocks))]


def gathered_rows(model: Any, pg: Any) -> Dict[str, Dict[int, torch.Tensor]]:
    """Table -> global ID -> full row (weights), from every tier of every rank's shards."""
    local = []
    for kernel, t, layout in local_shards(model):  # read from the tiers, not through the Saver's export
        keys, rows, col0 = kernel.export_rows(t)
        local.append((layout.table, layout.to_global(keys).tolist(), rows.float(), col0))
    gathered: List[Any] = [None] * pg.size()
    dist.all_gather_object(gathered, local, group=pg)
    pieces: Dict[str, Dict[int, Dict[int, torch.Tensor]]] = {}
    for rank_parts in gathered:
        for table, ids, rows, col0 in rank_parts:
            for i, row in zip(ids, rows):
                pieces.setdefault(table, {}).setdefault(i, {})[col0] = row
    return {table: {i: torch.cat([cols[c] for c in sorted(cols)]) for i, cols in ids.items()}
            for table, ids in pieces.items()}


def stats(model: Any, pg: Any, hash_only: bool = False) -> Dict[str, int]:
    """Hash-table counters summed over tables, shards and ranks (column shards count once per row block);
    ``hash_only``: without the plain KEY_VALUE table's (whose cache a DCP load leaves to refill)."""
    local: Dict[str, int] = {}
    for kernel, t, layout in local_shards(model):
        if layout.col0 == 0 and (layout.hash_ids or not hash_only):
            for name, value in kernel.slot_table(t).stats().items():
                local[name] = local.get(name, 0) + value
    gathered: List[Any] = [None] * pg.size()
    dist.all_gather_object(gathered, local, group=pg)
    return {k: sum(g.get(k, 0) for g in gathered) for k in sorted({k for g in gathered for k in g})}


def row_diff(a: Dict[str, Dict[int, torch.Tensor]], b: Dict[str, Dict[int, torch.Tensor]]) -> float:
    if a.keys() != b.keys() or any(a[t].keys() != b[t].keys() for t in a):
        return float("inf")
    return max((max(((a[t][i] - b[t][i]).abs().max().item() for i in a[t]), default=0.0) for t in a), default=0.0)


def output_diff(a: List[List[torch.Tensor]], b: List[List[torch.Tensor]]) -> float:
    return max((x - y).abs().max().item() if x.numel() else 0.0 for sa, sb in zip(a, b) for x, y in zip(sa, sb))


# -- the actions -------------------------------------------------------------------------------------------------------


def save_action(case: Dict[str, Any], pg: Any, directory: str) -> Dict[str, Any]:
    """Train with saves on the way, then on without stopping; write the reference for the loads."""
    model = build(case, case["sharding_type"], case["kernel"], pg, os.path.join(directory, "disk"))
    saver = Saver(process_group=pg)
    step = 0
    for i, steps in enumerate(SAVES):
        for _ in range(steps):
            train_step(model, case["kind"], step, pg)
            step += 1
        saver.save(model, os.path.join(directory, "ckpt"), incremental=i > 0)
    kinds = [info.kind for info in Saver.versions(os.path.join(directory, "ckpt"))]
    saved = gathered_rows(model, pg)
    outputs = [train_step(model, case["kind"], step + k, pg) for k in range(CONTINUE)]
    reference = {"saved": _rows_payload(saved), "outputs": outputs, "final": _rows_payload(gathered_rows(model, pg)),
                 "stats": stats(model, pg), "step": step}
    if pg.rank() == 0:
        torch.save(reference, os.path.join(directory, "reference.pt"))
        with open(os.path.join(directory, "case.json"), "w") as f:
            json.dump({**case, "world_size": pg.size()}, f)
    dist.barrier(group=pg)
    return {"saved_ids": sum(len(ids) for ids in saved.values()), "save_kinds": kinds}


def load_action(spec: Dict[str, Any], sharding_type: str, kernel: str, pg: Any, directory: str,
                same_layout: bool) -> Dict[str, Any]:
    """Load ``directory``'s checkpoint into ``spec``'s model laid out as asked, train on, compare (a ``damage``:
    see :func:`refused_load`)."""
    reference = torch.load(os.path.join(directory, "reference.pt"), weights_only=True)
    disk = tempfile.mkdtemp(prefix="disk-", dir=directory) if pg.rank() == 0 else None
    model = build(spec, sharding_type, kernel, pg, _broadcast(disk, pg))
    if spec.get("damage"):
        return refused_load(model, spec["kind"], spec["damage"], pg, os.path.join(directory, "ckpt"),
                            trained=spec.get("load_into") != "fresh_model")
    info = Saver(process_group=pg).load(model, os.path.join(directory, "ckpt"))
    exact = all(kernel.slot_table(t).checkpoint_mark == info.id for kernel, t, _ in local_shards(model))
    exact = all(_gather(exact, pg))
    loaded = gathered_rows(model, pg)
    rows_err = row_diff(loaded, _rows_of_payload(reference["saved"]))
    outputs = [train_step(model, spec["kind"], reference["step"] + k, pg) for k in range(CONTINUE)]
    result = {
        "rows_err": rows_err,
        "fwd_err": output_diff(outputs, reference["outputs"]),
        "final_err": row_diff(gathered_rows(model, pg), _rows_of_payload(reference["final"])),
        "exact": exact,
        "ids": sum(len(ids) for ids in loaded.values()),
        "chain": list(info.chain),
        "same_layout": same_layout,
    }
    if same_layout:
        after = stats(model, pg)
        result["stats_err"] = float(max(abs(after.get(k, 0) - reference["stats"].get(k, 0)) for k in after))
    result["residency"] = trained_where(model, spec["kind"], pg)  # last: its forward moves the counters
    return result


def refused_load(model: Any, kind: str, damage: str, pg: Any, checkpoint: str, trained: bool = True
                 ) -> Dict[str, Any]:
    """A Saver load that one rank alone must refuse, the model trained a step first unless not ``trained``:
    ``"flipped_byte"`` (a byte of the last rank's rows in the full save flipped) or ``"host_memory"`` (the last rank
    has 1 KB of host memory for the load). Reported: ``refused_ranks``, ``load_error`` (every rank's message) and
    ``unchanged`` (every table on every rank as it was: a load is all or nothing). An untrained model's KEY_VALUE
    tiers hold no row, so its ranks store the rows as they read them (one pass) and must empty those tiers again."""
    if trained:
        train_step(model, kind, 0, pg)
    before = gathered_rows(model, pg)
    last = pg.rank() == pg.size() - 1
    if damage == "flipped_byte" and last:
        _flip_a_row_byte(checkpoint, pg.rank())
    dist.barrier(group=pg)
    short = mock.patch.object(restore, "available_memory", lambda: 1024) if damage == "host_memory" and last else (
        contextlib.nullcontext())
    error = ""
    try:
        with short:
            Saver(process_group=pg).load(model, checkpoint)
    except (CapacityError, StorageError) as err:
        error = f"rank {pg.rank()}: {type(err).__name__}: {err}"
    errors = _gather(error, pg)
    return {"load_error": " | ".join(e for e in errors if e), "refused_ranks": sum(1 for e in errors if e),
            "unchanged": row_diff(gathered_rows(model, pg), before) == 0.0,
            "residency": trained_where(model, kind, pg)}


def _flip_a_row_byte(checkpoint: str, rank: int) -> None:
    """Flip a byte inside the first rows block that ``rank`` wrote in the checkpoint's full save."""
    directory, metadata = resolve_chain(checkpoint)[0]
    entry = next(e for e in metadata["shards"] if e["file"].startswith(f"rank-{rank:05d}-") and e["blocks"])
    with open(os.path.join(directory, entry["file"]), "r+b") as f:
        f.seek(entry["blocks"][0]["rows"]["offset"] + 5)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))


def dcp_action(case: Dict[str, Any], world: Any, directory: str) -> Dict[str, Any]:
    """Train, save model and fused optimizer state with stock DCP, train on; load into the second layout, train on.
    With ``damage`` (:data:`DAMAGES`), the save or the load is damaged on the way and must be refused."""
    model = build(case, case["sharding_type"], case["kernel"], world, os.path.join(directory, "disk"))
    steps = sum(SAVES)
    for step in range(steps):
        train_step(model, case["kind"], step, world)
    damage = case.get("damage", "")
    checkpoint = os.path.join(directory, "dcp")
    dcp.save(_damaged_save(model, case["kind"], damage), checkpoint_id=checkpoint, process_group=world)
    if damage == "cut_short" and world.rank() == 0:  # half of one file, as a copy interrupted midway leaves it
        shutil.copytree(checkpoint, checkpoint + "-intact")
        first = sorted(f for f in os.listdir(checkpoint) if f.endswith(".distcp"))[0]
        os.truncate(os.path.join(checkpoint, first), os.path.getsize(os.path.join(checkpoint, first)) // 2)
    dist.barrier(group=world)
    saved = gathered_rows(model, world)
    outputs = [train_step(model, case["kind"], steps + k, world) for k in range(CONTINUE)]
    final, final_stats = gathered_rows(model, world), stats(model, world, hash_only=True)
    pg = first_ranks(world, case["load_world_size"])
    if pg is None:
        return {}
    disk = tempfile.mkdtemp(prefix="disk-", dir=directory) if pg.rank() == 0 else None
    other = {**case, "dim": case.get("load_dim", DIM), "optimizer": case.get("load_optimizer", case["optimizer"]),
             "capacity": case.get("load_capacity")}
    loaded = build(other, case["load_sharding_type"], case["load_kernel"], pg, _broadcast(disk, pg))
    if damage == "id_twice":  # the save loaded first: the damaged load then writes over rows the table holds
        _damaged_load(loaded, case["kind"], checkpoint, "", pg)
        assert not settle_loads(loaded)
    before = gathered_rows(loaded, pg)
    try:
        _damaged_load(loaded, case["kind"], checkpoint, damage, pg)
        refusals = settle_loads(loaded)  # tables whose rows were all in are applied now, or refused
    except (CheckpointException, ConfigError) as err:  # reported: a refusal is the expected result of some cases
        refusals = [str(err)] + settle_loads(loaded)
    refusals = sorted({message for rank in _gather(refusals, pg) for message in rank})  # a rank may refuse alone
    refused = {"load_error": " | ".join(refusals), "unchanged": row_diff(gathered_rows(loaded, pg), before) == 0.0}
    if damage == "cut_short":  # DCP reports a failed read only after every rank has read: load again (README)
        _damaged_load(loaded, case["kind"], checkpoint + "-intact", "", pg)
        refused["reload_refusals"] = sum(len(r) for r in _gather(settle_loads(loaded), pg))
    elif refusals:
        return {**refused, "residency": trained_where(loaded, case["kind"], pg)}
    rows = gathered_rows(loaded, pg)
    after = [train_step(loaded, case["kind"], steps + k, pg) for k in range(CONTINUE)]
    same = (case["load_sharding_type"], case["load_kernel"], pg.size()) == (
        case["sharding_type"], case["kernel"], world.size())
    loaded_stats = stats(loaded, pg, hash_only=True)  # the policies' decisions (hits, evictions, admissions)
    return {**refused, "rows_err": row_diff(rows, saved), "ids": sum(len(ids) for ids in rows.values()),
            "fwd_err": output_diff(after, outputs), "final_err": row_diff(gathered_rows(loaded, pg), final),
            "same_layout": same, "exact": same,
            "stats_err": float(max(abs(loaded_stats.get(k, 0) - final_stats.get(k, 0)) for k in final_stats)),
            "residency": trained_where(loaded, case["kind"], pg)}


#: A dcp case's ``damage``, done by hand to the save or the load -> what the refusal must say (any one of the
#: alternatives, each a list of fragments). KEY_VALUE tables must be left as they were; FUSED tables are written
#: in place by DCP, as in stock TorchRec (the README: load again before training), so only the refusal is checked.
DAMAGES: Dict[str, List[List[str]]] = {
    # copy_ into some rows of one window of table 'plain' (as TorchRec's test harness writes), no dcp.load
    "part_of_a_table": [["KEY_VALUE table 'plain'", "values", "nothing was changed"]],
    # after dcp.load, one held ID written into a second row of table 'user' on every rank
    "id_twice": [["'user'", "an ID twice", "nothing was changed"]],
    # half of one .distcp file: DCP fails (then the intact copy is loaded, and must restore the saved model)
    "cut_short": [["CheckpointException"]],
    # each rank's policy_state entry of table 'user' cut to 100 bytes at the save
    "policy_state": [["hash table 'user'", "its policy_state entry cannot be read"]],
    # the model's state_dict without 'user.weight_id' (rows without their IDs)
    "rows_without_ids": [["hash table 'user'", "without the ID of each row"]],
    # saved table_wise, loaded row_wise: IDs onto shards that do not own them (refused by the placement check, or
    # by DCP: no saved policy state for a shard)
    "misplaced_key_value": [["do not belong to it", "KEY_VALUE table '"],
                            ["Missing key in checkpoint state_dict", ".policy_state."]],
    # the same with FUSED tables, the model alone (no policy state asked for): the placement check must refuse
    "model_only": [["hash table '", "puts IDs on a shard that does not own them", "torchrec_ascend.Saver"]],
}
#: A round trip's ``damage`` on the last rank alone (:func:`refused_load`) -> (what every rank's refusal says, what).
SAVER_DAMAGES: Dict[str, Tuple[List[str], str]] = {
    "flipped_byte": (["checksum", "StorageError"], "a flipped byte in the last rank's rows"),
    "host_memory": (["CapacityError", "table '", "host memory"], "too little host memory on the last rank"),
}


def _damaged_save(model: Any, kind: str, damage: str) -> Dict[str, Any]:
    """What a dcp case saves: the model's and its fused optimizer's state_dict, damaged as ``damage`` says."""
    state = {"model": model.state_dict(), "optim": model.fused_optimizer.state_dict()}
    if damage == "policy_state":
        entries = state["optim"]["state"][f"{_collection(kind)}.user.weight"]["user.policy_state"]
        for shard in [key for key in entries if key != "version"]:
            entries[shard] = entries[shard][:100]
    return state


def _damaged_load(model: Any, kind: str, checkpoint: str, damage: str, pg: Any) -> None:
    """Load ``checkpoint`` into ``model`` the stock way (dcp.load, then both load_state_dict), damaged as asked."""
    prefix = _collection(kind)
    if damage == "id_twice":  # into a model that holds the save: its rows again, one of its IDs in a second row
        model_state = model.state_dict()
        weights, ids = (model_state[f"{prefix}.user.{name}"].local_shards()[0].tensor for name in ("weight",
                                                                                                  "weight_id"))
        twice = ids.clone()
        held = (twice[:, 0] >= 0).nonzero().squeeze(1)
        twice[held[1]] = twice[held[0]]
        weights.copy_(weights.clone())
        ids.copy_(twice)
        return
    if damage == "model_only":  # no optimizer state_dict: no policy state asked for
        model_state = model.state_dict()
        dcp.load({"model": model_state}, checkpoint_id=checkpoint, process_group=pg)
        model.load_state_dict(model_state)
        return
    state = {"model": model.state_dict(), "optim": model.fused_optimizer.state_dict()}
    if damage == "part_of_a_table":
        window = state["model"][f"{prefix}.plain.weight"].local_shards()[0].tensor
        window.narrow(0, 0, 4).copy_(torch.zeros(4, window.shape[1]))
        return
    if damage == "rows_without_ids":
        del state["model"][f"{prefix}.user.weight_id"]
    dcp.load(state, checkpoint_id=checkpoint, process_group=pg)
    model.load_state_dict(state["model"])
    model.fused_optimizer.load_state_dict(state["optim"])


def _collection(kind: str) -> str:
    """The state_dict prefix of a collection's tables: ``embeddings`` (EC) or ``embedding_bags`` (EBC)."""
    return "embeddings" if kind == "ec" else "embedding_bags"


def trained_where(model: Any, kind: str, pg: Any) -> Dict[str, List[str]]:
    """Where ``model``'s parameters, fused optimizer state, a batch and its outputs live (one forward, no update)."""
    kjt, _ = local_part(0, pg.rank(), pg.size())
    with torch.no_grad():
        outputs = rows_of(kind, model(kjt), kjt)
    return residency(parameters=model, optimizer=model.fused_optimizer, inputs=kjt, outputs=outputs)


class DenseOnTop(torch.nn.Module):
    """A linear layer over the pooled embeddings of a collection (the dense part of a model)."""

    def __init__(self, collection: torch.nn.Module, seed: int) -> None:
        super().__init__()
        self.ebc = collection
        torch.manual_seed(seed)
        self.dense = torch.nn.Linear(2 * DIM, 1)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.dense(self.ebc(kjt).values())


def dense_action(world: Any) -> Dict[str, Any]:
    """Save a hash table with the Saver and the rest with DCP, load both into a model with other dense weights."""
    with shared_directory("dense-", world) as directory:
        return _dense_round_trip(world, directory)


def _dense_round_trip(world: Any, directory: str) -> Dict[str, Any]:

    def build_dense(seed: int) -> Tuple[Any, List[torch.nn.Parameter]]:
        ebc = torchrec.EmbeddingBagCollection(tables=[
            HashEmbeddingBagConfig(name="user", num_embeddings=CAPACITY["default"], embedding_dim=DIM,
                                   feature_names=["f_user"]),
            torchrec.EmbeddingBagConfig(name="plain", num_embeddings=PLAIN_ROWS, embedding_dim=DIM,
                                        feature_names=["f_plain"]),
        ])
        apply_optimizer_in_backward(torch.optim.Adagrad, list(ebc.parameters()), {"lr": LR})
        model = DenseOnTop(ebc, seed)
        constraints = {name: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])
                       for name in ("user", "plain")}
        return planned(model, constraints, world), list(model.dense.parameters())

    def batch(step: int) -> KeyedJaggedTensor:
        kjt, _ = local_part(step, world.rank(), world.size())
        return KeyedJaggedTensor.from_jt_dict({f: kjt[f] for f in ("f_user", "f_plain")})

    saved, dense_parameters = build_dense(seed=1)
    optimizer = torch.optim.SGD(dense_parameters, lr=LR)
    for step in range(3):
        saved(batch(step)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    Saver(process_group=world).save(saved, os.path.join(directory, "sparse"))
    dcp.save({"model": dense_state_dict(saved)}, checkpoint_id=os.path.join(directory, "dense"))
    loaded, _ = build_dense(seed=2)
    state = {"model": dense_state_dict(loaded)}
    dcp_keys = sorted(state["model"])  # before load_state_dict: TorchRec's adds prefixes to the dict it is given
    dcp.load(state, checkpoint_id=os.path.join(directory, "dense"))
    loaded.load_state_dict(state["model"], strict=False)
    Saver(process_group=world).load(loaded, os.path.join(directory, "sparse"))
    with torch.no_grad():
        out = loaded(batch(9))
        err = (saved(batch(9)) - out).abs().max().item()
    where = residency(parameters=loaded, optimizer=[loaded.fused_optimizer, optimizer], inputs=batch(9), outputs=out)
    return {"dense_err": err, "saver_keys": sorted(saver_keys(saved)), "dcp_keys": dcp_keys, "residency": where}


def run_case(case: Dict[str, Any], world: Any) -> Dict[str, Any]:
    action = case["action"]
    if action == "dense":
        return dense_action(world)
    if action == "gone_ids":
        return gone_ids.run(case, world)
    if action == "dcp":
        with shared_directory("dcp-", world) as directory:
            return dcp_action(case, world, directory)
    if action == "save":
        return save_action(case, world, case["dir"])
    if action == "load":
        spec = json.load(open(os.path.join(case["dir"], "case.json")))
        pg = first_ranks(world, case.get("world_size", world.size()))
        if pg is None:
            return {}
        same = (case["sharding_type"], case["kernel"], pg.size()) == (
            spec["sharding_type"], spec["kernel"], spec["world_size"])
        return load_action(spec, case["sharding_type"], case["kernel"], pg, case["dir"], same)
    with shared_directory("ckpt-", world) as directory:
        saved = save_action(case, world, directory)
        pg = first_ranks(world, case["load_world_size"])
        result: Dict[str, Any] = {**saved}
        if pg is not None:
            same = (case["load_sharding_type"], case["load_kernel"], pg.size(), case.get("load_capacity")) == (
                case["sharding_type"], case["kernel"], world.size(), None)
            spec = {**case, "capacity": case.get("load_capacity")}
            result.update(load_action(spec, case["load_sharding_type"], case["load_kernel"], pg, directory, same))
    return result



def _broadcast(value: Any, pg: Any) -> Any:
    box = [value]
    dist.broadcast_object_list(box, src=dist.get_global_rank(pg, 0), group=pg)
    return box[0]


def _gather(value: Any, pg: Any) -> List[Any]:
    out: List[Any] = [None] * pg.size()
    dist.all_gather_object(out, value, group=pg)
    return out


def _rows_payload(rows: Dict[str, Dict[int, torch.Tensor]]) -> Dict[str, Dict[str, torch.Tensor]]:
    """Rows as tensors only (``torch.load(weights_only=True)`` reads them back)."""
    out = {}
    for table, by_id in rows.items():
        ids = sorted(by_id)
        out[table] = {"ids": torch.tensor(ids, dtype=torch.int64),
                      "rows": torch.stack([by_id[i] for i in ids]) if ids else torch.empty(0, DIM)}
    return out


def _rows_of_payload(payload: Dict[str, Dict[str, torch.Tensor]]) -> Dict[str, Dict[int, torch.Tensor]]:
    return {table: dict(zip(p["ids"].tolist(), p["rows"])) for table, p in payload.items()}


if __name__ == "__main__":
    main(__doc__, run_case, worst=("rows_err", "fwd_err", "final_err", "stats_err"))

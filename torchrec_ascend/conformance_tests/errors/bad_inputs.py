"""Bad inputs to hash tables, sharded and unsharded: run each one and record the error it raises.

Run with torchrun on ONE rank (``conformance_tests/launch.py``): a case that raises inside a sharded module on one
rank of several would leave the others waiting in a collective. Each case is ``{"kind": ..., ...}``:

* ``{"kind": "negative_id", "sharding_type": "unsharded"|<type>}``: a batch with a negative ID in feature
  ``f_item`` of table ``item``.
* ``{"kind": "full_table", "sharding_type": "unsharded"|<type>}``: more new IDs than the table ``item`` holds, with
  ``overflow="error"``.
* ``{"kind": "unknown_eviction_policy"}``: table ``item`` configured with the misspelled policy ``"lruu"``.
* ``{"kind": "small_cache", "sharding_type": <type>}``: a KEY_VALUE table ``item`` whose device cache holds fewer
  rows than one batch brings.
* ``{"kind": "unsupported_sharding", "sharding_type": <type>, "plan": "planner"|"by_hand"}``: hash table ``item``
  constrained to a sharding type hash tables do not support (the planner finds no option), or given it in a plan
  written by hand (``construct_module_sharding_plan``).
* ``{"kind": "mixed_row_wise", "sharding_type": "row_wise"}``: hash table ``item`` and a plain table ``user`` in one
  module, both row_wise.

Rank 0 writes per case ``raised`` (the exception type name, or ``""`` when nothing was raised), ``kinds`` (the names
of its classes, base classes included) and ``message``; the suite (``test_errors.py``) decides whether the message
names what it must (``raised_at``: the traceback).
"""

from __future__ import annotations

import tempfile
import traceback
from typing import Any, Dict, Optional

import torch
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import ParameterConstraints
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_row_wise, table_wise
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv, ShardingPlan
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.conformance_tests.launch import script_device
from torchrec_ascend.conformance_tests.plugin.runner import main, planned

DIM = 8
TABLES = ("user", "item")  # the cases break table "item" (feature "f_item"); "user" stays healthy
CAPACITY = 64


def make_module(plain_user: bool = False, **item_options: Any) -> torch.nn.Module:
    """An EmbeddingBagCollection of two hash tables (``plain_user``: table ``user`` a plain one); ``item_options``
    go to table ``item``'s config."""
    def config(name: str) -> Any:
        common = dict(name=name, embedding_dim=DIM, num_embeddings=CAPACITY, feature_names=[f"f_{name}"])
        if name == "user" and plain_user:
            return torchrec.EmbeddingBagConfig(**common)
        return HashEmbeddingBagConfig(**common, **(item_options if name == "item" else {}))

    return torchrec.EmbeddingBagCollection(tables=[config(name) for name in TABLES])


def make_batch(item_ids: torch.Tensor) -> KeyedJaggedTensor:
    """One sample per item ID; ``f_user`` reads the same valid ID in every sample (its table never fills)."""
    n = item_ids.numel()
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f_user", "f_item"],
        values=torch.cat([torch.zeros(n, dtype=torch.int64), item_ids]),
        lengths=torch.ones(2 * n, dtype=torch.int64),
    )


def shard(module: torch.nn.Module, sharding_type: str, pg: Any, kernel: str = "fused",
          key_value: Optional[Dict[str, Any]] = None, user_sharding_type: Optional[str] = None) -> Any:
    """``module`` planned and sharded, each table constrained to ``sharding_type`` and ``kernel`` (table ``user`` to
    ``user_sharding_type`` when given)."""
    types = {"user": user_sharding_type or sharding_type, "item": sharding_type}
    constraints = {
        name: ParameterConstraints(sharding_types=[types[name]], compute_kernels=[kernel], **(key_value or {}))
        for name in TABLES
    }
    return planned(module, constraints, pg)


def shard_by_hand(module: torch.nn.Module, pg: Any, item_sharding: Any) -> Any:
    """``module`` sharded by a plan written by hand: ``user`` table_wise, ``item`` as ``item_sharding`` says."""
    device = script_device()
    sharders = get_default_hybrid_sharders()
    per_table = {"user": table_wise(rank=0), "item": item_sharding}
    plan = construct_module_sharding_plan(module, per_param_sharding=per_table, local_size=pg.size(),
                                          world_size=pg.size(), device_type=device.type, sharder=sharders[0])
    return DistributedModelParallel(module, env=ShardingEnv.from_process_group(pg), device=device,
                                    plan=ShardingPlan({"": plan}), sharders=sharders)


def build(case: Dict[str, Any], pg: Any, directory: str, **item_options: Any) -> Any:
    module = make_module(plain_user=case["kind"] == "mixed_row_wise", **item_options)
    sharding_type = case.get("sharding_type", "unsharded")
    if sharding_type == "unsharded":
        return module.to(script_device())
    if case.get("plan") == "by_hand":
        if sharding_type != "table_row_wise":
            raise ValueError(f"bad_inputs.py: no hand-written plan for {sharding_type!r}")
        return shard_by_hand(module, pg, table_row_wise(host_index=0))
    if case["kind"] == "unsupported_sharding":  # only table item is constrained to it
        return shard(module, sharding_type, pg, user_sharding_type="table_wise")
    if case["kind"] != "small_cache":
        return shard(module, sharding_type, pg)
    key_value = {"cache_params": CacheParams(load_factor=case["cache_rows"] / CAPACITY),
                 "key_value_params": KeyValueParams(l2_cache_size=1 / 1024, ssd_storage_directory=directory)}
    return shard(module, sharding_type, pg, kernel="key_value", key_value=key_value)


def run_case(case: Dict[str, Any], pg: Any) -> None:
    """Run the bad input of ``case``; the exception it should raise propagates."""
    device = script_device()
    with tempfile.TemporaryDirectory(prefix="bad_inputs_") as directory:
        if case["kind"] == "unknown_eviction_policy":
            model = build(case, pg, directory, overflow="evict", eviction_policy="lruu")
            model(make_batch(torch.arange(4)).to(device))
        elif case["kind"] == "negative_id":
            model = build(case, pg, directory)
            model(make_batch(torch.tensor([3, -5, 7])).to(device))
        elif case["kind"] == "full_table":
            model = build(case, pg, directory)  # overflow="error" is the default
            model(make_batch(torch.arange(2 * CAPACITY)).to(device))
        elif case["kind"] == "small_cache":
            model = build(case, pg, directory)
            model(make_batch(torch.arange(4 * case["cache_rows"])).to(device))
        elif case["kind"] in ("unsupported_sharding", "mixed_row_wise"):
            build(case, pg, directory)  # refused while planning or sharding
        else:
            raise ValueError(f"bad_inputs.py: unknown case kind {case['kind']!r}")


def recorded(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    """Run ``case`` and record what it raised (the point of every case), for the scripts' case loop."""
    if pg.size() != 1:
        raise SystemExit("bad_inputs.py runs on one rank (a case raising on one rank of several would hang the rest)")
    try:
        run_case(case, pg)
    except Exception as err:
        return {"raised": type(err).__name__, "kinds": [cls.__name__ for cls in type(err).__mro__],
                "message": str(err), "raised_at": traceback.format_exc()}
    return {"raised": "", "kinds": [], "message": ""}


if __name__ == "__main__":
    main(__doc__, recorded)

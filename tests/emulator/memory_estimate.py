"""The planner's device-memory estimate of a sharded table against the emulated NPU's measured peak, per rank.

Run with torchrun through ``conformance_tests/emulated_run.py`` (``tests/emulator/test_memory_estimate.py``); each
case is ``{"kernel": "fused"|"key_value", "sharding_type": ..., "optimizer": ..., "rows": N, "dim": D,
"cache_rows": R, "steps": S}``: the KEY_VALUE conformance model (``conformance_tests/plugin/key_value.py``: two hash
tables, EBC) with ``N`` rows of dim ``D`` per table, planned by TorchRec's planner on the emulated npu and trained
``S`` steps (the planner is told the batch size, and assumes its default pooling factor). Reported per rank
(``per_rank``: ``(estimate, after_shard, peak)``): ``estimate``, the HBM bytes the plan gives the rank's shards
(weights, optimizer state, cache, a batch's swap staging, pipeline buffers: TorchRec's storage estimate through our
hooks), ``after_shard``, the bytes held once sharded, and ``peak``, the emulator's
``torch.npu.max_memory_allocated()`` above what the rank held before sharding; and ``swapped_out``, per rank, the
rows the KEY_VALUE caches evicted (0 for FUSED). ``{"kernel": ..., "hbm_cap": B}`` instead only plans, on a Topology
of ``B`` bytes of HBM per device, and reports the planner's error.
"""

from __future__ import annotations

import gc
import tempfile
from typing import Any, Dict

import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.conformance_tests.launch import script_device
from torchrec_ascend.conformance_tests.plugin.hash_tables import OPTIMIZERS
from torchrec_ascend.conformance_tests.plugin.key_value import BATCH, make_batch
from torchrec_ascend.conformance_tests.plugin.runner import main
from torchrec_ascend.kernels.key_value import cache_metrics

TABLES = ("user", "item")


def plan(case: Dict[str, Any], pg: Any, directory: str, hbm_cap: Any = None) -> Any:
    module = torchrec.EmbeddingBagCollection(tables=[
        HashEmbeddingBagConfig(name=n, num_embeddings=case["rows"], embedding_dim=case["dim"],
                               feature_names=[f"f_{n}"], init_seed=3)
        for n in TABLES
    ])
    cls, kwargs = OPTIMIZERS[case["optimizer"]]
    apply_optimizer_in_backward(cls, [b.weight for b in module.embedding_bags.values()], dict(kwargs))
    key_value = case["kernel"] == "key_value"
    shard_rows = case["rows"] // pg.size() if case["sharding_type"] == "row_wise" else case["rows"]
    constraints = {
        n: ParameterConstraints(
            sharding_types=[case["sharding_type"]], compute_kernels=[case["kernel"]],
            cache_params=CacheParams(load_factor=case["cache_rows"] / shard_rows) if key_value else None,
            key_value_params=KeyValueParams(ssd_storage_directory=directory) if key_value else None,
        )
        for n in TABLES
    }
    device = script_device()
    topology = Topology(world_size=pg.size(), compute_device=device.type, hbm_cap=hbm_cap)
    # The batch size the model trains with (make_batch's), so the pipeline buffers are estimated for it.
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, constraints=constraints)
    sharders = get_default_hybrid_sharders()
    return module, planner, planner.plan(module, sharders), sharders


def run_case(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    rank, device = pg.rank(), script_device()
    with tempfile.TemporaryDirectory(prefix="kv_mem_") as directory:
        if "hbm_cap" in case:
            try:
                plan(case, pg, directory, hbm_cap=case["hbm_cap"])
            except Exception as err:  # the refusal is the result
                return {"planned": False, "error_text": f"{type(err).__name__}: {err}"}
            return {"planned": True, "error_text": ""}
        gc.collect()
        base = torch.npu.memory_allocated(device)
        torch.npu.reset_peak_memory_stats(device)
        module, planner, sharding_plan, sharders = plan(case, pg, directory)
        estimate = sum(s.storage.hbm for so in planner._best_plan for s in so.shards if s.rank == rank)
        dmp = DistributedModelParallel(module, env=ShardingEnv.from_process_group(pg), device=device,
                                       plan=sharding_plan, sharders=sharders)
        after_shard = torch.npu.memory_allocated(device) - base
        for step in range(case["steps"]):
            batch = make_batch(step, rank, world=pg.size()).to(device)
            dmp(batch).values().sum().backward()
        peak = torch.npu.max_memory_allocated(device) - base
        swapped_out = sum(table["swapped_out"] for table in cache_metrics(dmp).values())
        del dmp, module
        gc.collect()
    gathered: list = [None] * pg.size()
    dist.all_gather_object(gathered, (estimate, after_shard, peak), group=pg)
    swaps: list = [None] * pg.size()
    dist.all_gather_object(swaps, swapped_out, group=pg)
    return {"per_rank": gathered, "swapped_out": swaps}


if __name__ == "__main__":
    main(__doc__, run_case)

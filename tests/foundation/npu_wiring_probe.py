"""Probe of the NPU wiring, run as ``import npu_wiring_probe`` in a fresh interpreter with the STAND-INS.

``tests/foundation/test_npu_standin.py`` runs it with the torch_npu / fbgemm_ascend stand-ins first on PYTHONPATH
and ``TORCHREC_ASCEND_DEVICE=npu``, and asserts on the facts it reports. Nothing here runs on an NPU: the stand-ins
register the device, its streams and a few op kernels, no tensor can live there.
"""

from __future__ import annotations

import copy
import sys
import types
from typing import Any, Dict, List

import torch
import torchrec
from torchrec.distributed.comm_ops import Request
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.estimator.types import HardwarePerfConfig
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
from torchrec.distributed.train_pipeline import train_pipelines
from torchrec.distributed.train_pipeline.pipeline_stage import PipelineStage, SparseDataDistUtil
from torchrec.distributed.utils import sharded_model_copy

from fresh_interpreter import report
from torchrec_ascend import backends
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.hooks import process_group, sparse_ops
from torchrec_ascend.injection import autoload

STREAM_ATTRS = ("_memcpy_stream", "_data_dist_stream", "_prefetch_stream", "_emb_lookup_stream", "_default_stream")


def embedding_bags() -> torchrec.EmbeddingBagCollection:
    configs = [
        torchrec.EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=1000, feature_names=[f"f{i}"])
        for i in range(3)
    ]
    return torchrec.EmbeddingBagCollection(tables=configs, device=torch.device("meta"))


def placements(plan: Any) -> Dict[str, List[str]]:
    return {name: [str(s.placement) for s in p.sharding_spec.shards] for name, p in plan.items()}


def planned(kernel: str, sharding_type: str) -> Dict[str, Any]:
    constraints = {
        f"t{i}": ParameterConstraints(sharding_types=[sharding_type], compute_kernels=[kernel]) for i in range(3)
    }
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="npu"), constraints=constraints)
    plan = planner.plan(embedding_bags(), [EmbeddingBagCollectionSharder()]).plan[""]
    return {"kernels": sorted({p.compute_kernel for p in plan.values()}), "placements": placements(plan)}


def stream_facts(pipeline: Any) -> Dict[str, Any]:
    facts: Dict[str, Any] = {}
    for attr in STREAM_ATTRS:
        if hasattr(pipeline, attr):
            stream = getattr(pipeline, attr)
            facts[attr] = None if stream is None else {"class": type(stream).__qualname__,
                                                       "module": type(stream).__module__,
                                                       "priority": getattr(stream, "priority", None)}
    facts["stream_context_is_npu_stream"] = pipeline._stream_context is torch.npu.stream
    return facts


def pipelines() -> Dict[str, Any]:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    npu = torch.device("npu")
    built = {
        "TrainPipelineBase": train_pipelines.TrainPipelineBase(model, optimizer, npu),
        "TrainPipelineSparseDist": train_pipelines.TrainPipelineSparseDist(model, optimizer, npu),
        "TrainPipelineFusedSparseDist": train_pipelines.TrainPipelineFusedSparseDist(
            model, optimizer, npu, emb_lookup_stream="new"
        ),
        "PrefetchTrainPipelineSparseDist": train_pipelines.PrefetchTrainPipelineSparseDist(model, optimizer, npu),
        "EvalPipelineSparseDist": train_pipelines.EvalPipelineSparseDist(model, optimizer, npu),
        "TrainPipelineSparseDistLite": train_pipelines.TrainPipelineSparseDistLite(model, optimizer, npu),
        "StagedTrainPipeline": train_pipelines.StagedTrainPipeline(
            [PipelineStage(name="stage", runnable=lambda batch: batch, stream=torch.npu.Stream())]
        ),
        "SparseDataDistUtil": SparseDataDistUtil(model, data_dist_stream=torch.npu.Stream()),
    }
    facts = {name: stream_facts(pipeline) for name, pipeline in built.items()}
    try:  # refused where TorchRec does not manage the device's streams (its lookup runs on CUDA streams only)
        train_pipelines.TrainPipelineSemiSync(model, optimizer, npu)
        facts["TrainPipelineSemiSync"] = {"refused": ""}
    except ConfigError as err:
        facts["TrainPipelineSemiSync"] = {"refused": str(err)}
    return facts


class NpuLookingTensor(torch.Tensor):
    """A CPU tensor that reports an npu device and records ``record_stream`` calls (no tensor can be on npu)."""

    recorded: List[Any] = []

    @property
    def device(self) -> torch.device:  # type: ignore[override]  # a fixed npu device instead of the attribute
        return torch.device("npu", 0)

    def record_stream(self, stream: Any) -> None:  # type: ignore[override]  # records instead of checking the stream
        NpuLookingTensor.recorded.append(stream)


def comm_record_stream() -> Dict[str, Any]:
    output = torch.zeros(2).as_subclass(NpuLookingTensor)
    request = types.SimpleNamespace(
        wait_function=types.SimpleNamespace(apply=lambda pg, req, dummy: output), pg=None, dummy_tensor=None
    )
    returned = Request._wait_impl(request)
    recorded = NpuLookingTensor.recorded
    return {
        "returned_output": returned is output,
        "recorded_on_current_stream": len(recorded) == 1 and recorded[0] is torch.npu.current_stream(),
    }


def model_copy() -> Dict[str, Any]:
    from torch_npu._C._distributed_c10d import ProcessGroupHCCL

    classes = process_group.no_copy_classes()
    stream, hccl = torch.npu.Stream(priority=-1), ProcessGroupHCCL()
    before = {cls: cls.__dict__.get("__deepcopy__", "absent") for cls in classes}
    with sharded_model_copy(device=None):
        copied = copy.deepcopy({"stream": stream, "pg": hccl})
    return {
        "no_copy": sorted(f"{c.__module__}.{c.__qualname__}" for c in classes),
        "stream_shared": copied["stream"] is stream,
        "pg_shared": copied["pg"] is hccl,
        "classes_restored": {cls: cls.__dict__.get("__deepcopy__", "absent") for cls in classes} == before,
    }


def sparse_op_kernels() -> Dict[str, Any]:
    import fbgemm_ascend

    profile = backends.active()
    return {
        "listed": list(profile.host_fallback_ops),
        "native": list(fbgemm_ascend.NATIVE_OPS),
        "registered": list(sparse_ops.REGISTERED),
        "has_kernel": {
            name: torch._C._dispatch_has_kernel_for_dispatch_key(f"fbgemm::{name}", sparse_ops.DISPATCH_KEY)
            for name in profile.host_fallback_ops
        },
    }


def default_devices() -> Dict[str, str]:
    """What the planner and explicit plans default to without a topology or device (TorchRec says "cpu")."""
    from torchrec.distributed import sharding_plan
    from torchrec.distributed.planner import planners

    return {"planners": planners.get_device_type(), "sharding_plan": sharding_plan.get_device_type()}


registry = autoload.registry()
report(
    {
        "selected": backends.selection_status().selected,
        "standins": {name: getattr(sys.modules.get(name), "STANDIN", False) for name in ("torch_npu", "fbgemm_ascend")},
        "patches": {s.patch.name: s.state.value for s in registry.report()} if registry else {},
        "plans": {f"{k}/{t}": planned(k, t) for k in ("fused", "key_value") for t in ("row_wise", "table_wise")},
        "enumerated": sorted(
            {
                f"{o.sharding_type}/{o.compute_kernel}"
                for o in EmbeddingEnumerator(Topology(world_size=2, compute_device="npu"), batch_size=512).enumerate(
                    embedding_bags(), [EmbeddingBagCollectionSharder()]
                )
            }
        ),
        "mc_kernels": ManagedCollisionEmbeddingBagCollectionSharder().compute_kernels("row_wise", "cuda"),
        "hbm_per_device": Topology(world_size=2, compute_device="npu").devices[0].storage.hbm,
        "bandwidths": {f"{d}/{k}": v for (d, k), v in HardwarePerfConfig.kernel_device_bandwidths.items()},
        "explicit_plan": placements(
            construct_module_sharding_plan(
                embedding_bags(), {f"t{i}": row_wise() for i in range(3)}, world_size=2, local_size=2
            )
        ),
        "default_devices": default_devices(),
        "pipelines": pipelines(),
        "comm": comm_record_stream(),
        "model_copy": model_copy(),
        "sparse_ops": sparse_op_kernels(),
    }
)

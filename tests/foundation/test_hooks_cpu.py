"""Hooks H1-H6 in this (CPU) process, where torch's entry point has patched TorchRec; and the CUDA wiring.

Oracles: the documented TorchRec 1.8 allow-lists (stock cpu list plus the cuda-only entries the cpu profile
declares), plain-Python references (cumsum, list rules), and the state of the classes before ``DMP.copy()``.
"""

from __future__ import annotations

import copy
import datetime
import types
from typing import Any, List

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend import backends
from torchrec_ascend.backends.cpu import CPU
from torchrec_ascend.errors import BackendError
from torchrec_ascend.hooks import pipeline_streams, process_group, sharding_allowlist, sparse_ops
from torchrec_ascend.injection import autoload

torchrec = pytest.importorskip("torchrec")
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig  # noqa: E402  (after importorskip)
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402  (after importorskip)
from torchrec.distributed.fused_embeddingbag import FusedEmbeddingBagCollectionSharder  # noqa: E402  (after importorskip)
from torchrec.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder  # noqa: E402  (after importorskip)
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology  # noqa: E402  (after importorskip)
from torchrec.distributed.planner.estimator.types import HardwarePerfConfig  # noqa: E402  (after importorskip)

STOCK_CPU_TYPES = ["data_parallel", "table_wise", "column_wise", "table_column_wise"]
ALL_TYPES = STOCK_CPU_TYPES + ["row_wise", "table_row_wise", "grid_shard"]


@pytest.fixture(autouse=True, scope="module")
def patched() -> None:
    registry = autoload.registry()
    assert registry is not None, "these tests run under the entry point: do not set TORCHREC_ASCEND_AUTOLOAD=0"
    registry.apply()  # import every target (fused and managed-collision sharders included)
    assert {s.state.value for s in registry.report()} == {"applied"}


def test_base_sharder_grants_cpu_the_types_its_profile_declares() -> None:
    assert EmbeddingBagCollectionSharder().sharding_types("cpu") == ALL_TYPES
    assert EmbeddingBagCollectionSharder().compute_kernels("row_wise", "cpu") == ["fused", "key_value"]
    assert EmbeddingBagCollectionSharder().compute_kernels("data_parallel", "cpu") == ["dense"]


def test_cuda_keeps_torchrecs_own_lists() -> None:
    assert EmbeddingBagCollectionSharder().sharding_types("cuda") == ALL_TYPES
    kernels = EmbeddingBagCollectionSharder().compute_kernels("row_wise", "cuda")
    assert kernels[:4] == ["fused", "fused_uvm", "fused_uvm_caching", "key_value"]
    assert "ssd_virtual_table" in kernels, "cuda's virtual-table kernels are not ours to remove"


def test_fused_sharder_grants_row_wise_but_not_grid_on_cpu() -> None:
    sharder = FusedEmbeddingBagCollectionSharder()
    assert sharder.sharding_types("cpu") == STOCK_CPU_TYPES + ["row_wise", "table_row_wise"]
    assert sharder.compute_kernels("row_wise", "cpu") == ["fused"]


def test_managed_collision_sharder_kernels_are_filtered_per_device() -> None:
    sharder = ManagedCollisionEmbeddingBagCollectionSharder()
    assert sharder.compute_kernels("row_wise", "cpu") == ["fused", "key_value"]
    assert sharder.compute_kernels("row_wise", "cuda") == ["fused", "fused_uvm_caching", "fused_uvm", "key_value"]
    assert sharder.sharding_types("cpu") == ["row_wise"], "stock intersects with row-wise: empty without H1"


@settings(max_examples=40, deadline=None)
@given(
    own=st.lists(st.sampled_from("abcdefg"), unique=True),
    reference=st.lists(st.sampled_from("abcdefg"), unique=True),
    declared=st.lists(st.sampled_from("abcdefg"), unique=True),
    device=st.sampled_from(["cpu", "cuda", "mtia"]),
)
def test_granted_rule(own: List[str], reference: List[str], declared: List[str], device: str) -> None:
    """Invariant of the allow-list rule: the device's own answer, then the declared part of cuda's, no repeats."""

    def query(device_type: str) -> List[str]:
        return reference if device_type == backends.TORCHREC_REFERENCE_DEVICE else own

    result = sharding_allowlist.granted(query, device, lambda profile: declared)
    if device == "mtia":  # no profile: TorchRec's answer untouched
        assert result == own
    elif device == backends.TORCHREC_REFERENCE_DEVICE:
        assert result == reference
    else:
        assert result == own + [x for x in reference if x in declared and x not in own]


def test_planning_profile_on_a_cpu_host() -> None:
    assert sharding_allowlist.planning_profile("cuda").name == "cuda", "no active backend plans as cuda here"
    assert sharding_allowlist.planning_profile("cpu") is backends.profile_for("cpu")
    assert sharding_allowlist.planning_profile("mtia") is None


def tables(n: int = 2) -> EmbeddingBagCollection:
    configs = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=64, feature_names=[f"f{i}"]) for i in range(n)
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta"))


def test_planner_plans_key_value_on_cpu() -> None:
    """Without H3 the perf estimator raises 'Unrecognized or unsupported compute kernel: key_value'."""
    bandwidths = HardwarePerfConfig.kernel_device_bandwidths
    assert bandwidths[("cpu", "key_value")] == CPU.planner.kernel_bandwidths["key_value"]
    constraints = {
        f"t{i}": ParameterConstraints(sharding_types=["row_wise"], compute_kernels=["key_value"]) for i in range(2)
    }
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), constraints=constraints)
    plan = planner.plan(tables(), [EmbeddingBagCollectionSharder()])
    shardings = plan.plan[""]
    assert {s.compute_kernel for s in shardings.values()} == {"key_value"}
    assert {str(shard.placement) for s in shardings.values() for shard in s.sharding_spec.shards} == {
        "rank:0/cpu",
        "rank:1/cpu",
    }


def test_cpu_pipeline_is_left_stock() -> None:
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    model = torch.nn.Linear(2, 2)
    pipeline = TrainPipelineSparseDist(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"))
    assert pipeline._memcpy_stream is None and pipeline._data_dist_stream is None
    assert pipeline._stream_context is torch.cuda.stream, "TorchRec's own no-op context on CPU"


def test_cuda_streams_are_left_to_torchrec() -> None:
    cuda = backends.profile_for("cuda")
    assert cuda.streams is not None and cuda.streams.managed_by_torchrec
    assert pipeline_streams.streamed_profile(torch.device("cuda")) is None
    fake = types.SimpleNamespace(_device=torch.device("cuda"), _memcpy_stream=None, _default_stream=None)
    pipeline_streams.fill_streams(fake)
    assert fake._memcpy_stream is None and fake._default_stream is None
    assert not hasattr(fake, "_stream_context")


def test_model_copy_shares_process_groups_and_restores_every_class() -> None:
    from torchrec.distributed.utils import sharded_model_copy

    classes = [torch.Tensor, torch.nn.Parameter] + process_group.no_copy_classes()
    before = {cls: cls.__dict__.get("__deepcopy__", "absent") for cls in classes}
    gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))
    assert type(gloo) in classes, "the cpu profile declares the gloo backend class"
    tensor = torch.arange(3.0)
    with sharded_model_copy(device="cpu"):
        copied = copy.deepcopy({"pg": gloo, "t": tensor})
    assert copied["pg"] is gloo
    assert copied["t"] is not tensor and torch.equal(copied["t"], tensor)
    assert {cls: cls.__dict__.get("__deepcopy__", "absent") for cls in classes} == before


def test_loaded_object_imports_nothing() -> None:
    assert process_group.loaded_object("torch._C._distributed_c10d:ProcessGroupGloo") is dist.ProcessGroupGloo
    assert process_group.loaded_object("torch.cuda.Stream") is torch.cuda.Stream
    assert process_group.loaded_object("module_nobody_imported_xyz:Thing") is None


def test_host_round_trip_equals_the_op() -> None:
    cumsum = torch.ops.fbgemm.asynchronous_complete_cumsum.default
    lengths = torch.tensor([2, 0, 3, 1])
    expected = [0]
    for n in lengths.tolist():
        expected.append(expected[-1] + n)
    assert sparse_ops.host_round_trip(cumsum)(lengths).tolist() == expected

    permute = torch.ops.fbgemm.permute_2D_sparse_data.default
    int32 = torch.int32
    lengths_2d = torch.tensor([[1, 2], [0, 1]], dtype=int32)
    args = (torch.tensor([1, 0], dtype=int32), lengths_2d, torch.arange(4), None, None)
    got, want = sparse_ops.host_round_trip(permute)(*args), permute(*args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g is None and w is None) or torch.equal(g, w)


def test_an_undefined_fallback_op_is_a_clear_error() -> None:
    import dataclasses

    profile = dataclasses.replace(CPU, name="typo_dev", host_fallback_ops=("no_such_op_xyz",))
    with pytest.raises(BackendError, match="typo_dev.*fbgemm::no_such_op_xyz.*op_modules"):
        sparse_ops.register_host_fallbacks(profile)
    assert sparse_ops.register_host_fallbacks(CPU) == [], "cpu needs no fallbacks"


def _shards(plan: Any) -> List[str]:
    return [str(s.placement) for s in plan.sharding_spec.shards]


def test_explicit_plans_on_cpu_are_unchanged() -> None:
    from torchrec.distributed import sharding_plan
    from torchrec.distributed.planner import planners

    plan = sharding_plan.construct_module_sharding_plan(
        tables(1), {"t0": sharding_plan.row_wise()}, world_size=2, local_size=2, device_type="cpu"
    )
    assert _shards(plan["t0"]) == ["rank:0/cpu", "rank:1/cpu"]
    assert sharding_plan.get_device_type() == planners.get_device_type() == backends.active().device_type

"""DeviceProfile validates itself: every malformed field is a ConfigError naming the profile and the field.

Oracles: the installed TorchRec and fbgemm enums (the vocabularies must cover them), and hand-written bad profiles.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List

import pytest

from torchrec_ascend import backends
from torchrec_ascend.backends import validation
from torchrec_ascend.backends.cpu import CPU
from torchrec_ascend.backends.cuda import CUDA
from torchrec_ascend.backends.npu import NPU
from torchrec_ascend.backends.profile import PlannerSpec, StreamSpec, TbeSpec
from torchrec_ascend.errors import ConfigError, PluginError
from torchrec_ascend.hookspecs import hookimpl
from torchrec_ascend.plugin_manager import get_plugin_manager, reset_plugin_manager


def test_vocabularies_cover_the_installed_torchrec_and_fbgemm() -> None:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import ComputeDevice, EmbeddingLocation
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.types import ShardingType

    assert {t.value for t in ShardingType} <= validation.SHARDING_TYPES
    assert {k.value for k in EmbeddingComputeKernel} <= validation.COMPUTE_KERNELS
    assert {o.name for o in EmbOptimType} <= validation.FUSED_OPTIMIZERS
    assert {loc.name for loc in EmbeddingLocation} <= validation.TBE_LOCATIONS
    assert {d.name for d in ComputeDevice} <= validation.TBE_COMPUTE_DEVICES


@pytest.mark.parametrize("profile", [CPU, CUDA, NPU], ids=lambda p: p.name)
def test_built_in_profiles_are_valid(profile: backends.DeviceProfile) -> None:
    validation.validate_profile(profile)


BAD: List[Dict[str, Any]] = [
    dict(changes={"sharding_types": ("table_wise", "row_wize")}, field="sharding_types",
         says="did you mean 'row_wise'"),
    dict(changes={"sharding_types": ()}, field="sharding_types", says="must not be empty"),
    dict(changes={"sharding_types": ["table_wise"]}, field="sharding_types", says="tuple of strings"),
    dict(changes={"sharding_types": ("table_wise", "table_wise")}, field="sharding_types", says="listed twice"),
    dict(changes={"compute_kernels": ("fussed",)}, field="compute_kernels", says="did you mean 'fused'"),
    dict(changes={"fused_optimizers": ("exact_sgd",)}, field="fused_optimizers", says="unknown value 'exact_sgd'"),
    dict(changes={"name": "My Device"}, field="name", says="lower-case identifier"),
    dict(changes={"device_type": ""}, field="device_type", says="non-empty string"),
    dict(changes={"collective_backend": None}, field="collective_backend", says="non-empty string"),
    dict(changes={"priority": "high"}, field="priority", says="expected an int"),
    dict(changes={"detect": True}, field="detect", says="callable"),
    dict(changes={"tbe": TbeSpec(location="HBM", compute_device="CPU")}, field="tbe.location", says="'HBM'"),
    dict(changes={"tbe": TbeSpec(location="HOST", compute_device="NPU")}, field="tbe.compute_device", says="'NPU'"),
    dict(
        changes={"streams": StreamSpec(device_module="torch.npu", priorities={"copy": 0})},
        field="streams.priorities",
        says="unknown value 'copy'",
    ),
    dict(
        changes={"streams": StreamSpec(device_module="torch npu", priorities={})},
        field="streams.device_module",
        says="dotted module path",
    ),
    dict(changes={"planner": PlannerSpec(hbm_cap_bytes=-1)}, field="planner.hbm_cap_bytes", says="positive int"),
    dict(
        changes={"planner": PlannerSpec(kernel_bandwidths={"key_valeu": 1.0})},
        field="planner.kernel_bandwidths",
        says="did you mean 'key_value'",
    ),
    dict(
        changes={"planner": PlannerSpec(kernel_bandwidths={"fused": 0})},
        field="planner.kernel_bandwidths",
        says="must be > 0",
    ),
    dict(changes={"kernel_overrides": {"pooled-fused": "m:C"}}, field="kernel_overrides", says="'<pooled|sequence>/"),
    dict(changes={"kernel_overrides": {"pooled/fused": "m.C"}}, field="kernel_overrides", says="'module:Class'"),
    dict(changes={"process_group_classes": ("torch.ProcessGroupGloo",)}, field="process_group_classes",
         says="qualname"),
    dict(changes={"op_modules": ("fbgemm-ascend",)}, field="op_modules", says="dotted module name"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: f"{c['field']}-{c['says'][:20]}")
def test_a_malformed_field_is_an_error_naming_profile_and_field(case: Dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        dataclasses.replace(CPU, **{"name": "thirdparty", **case["changes"]})
    message = str(info.value)
    assert "device backend profile " in message
    assert f"field {case['field']!r}" in message
    assert case["says"] in message


class _NotAProfile:
    @hookimpl
    def torchrec_ascend_device_backends(self) -> List[Any]:
        return [{"name": "dict_dev"}]


class _InvalidProfile:
    @hookimpl
    def torchrec_ascend_device_backends(self) -> List[Any]:
        return [dataclasses.replace(CPU, name="bad_dev", device_type="bad_dev", sharding_types=("rowwise",))]


@pytest.fixture
def fresh_manager():
    reset_plugin_manager()
    backends.reset_for_tests()
    yield get_plugin_manager()
    reset_plugin_manager()
    backends.reset_for_tests()


@pytest.mark.parametrize(
    "plugin, says",
    [
        (_NotAProfile(), "returned dict from torchrec_ascend_device_backends"),
        (_InvalidProfile(), "field 'sharding_types'"),
    ],
    ids=["not-a-profile", "invalid-profile"],
)
def test_a_plugin_returning_a_bad_profile_is_named(fresh_manager: Any, plugin: Any, says: str) -> None:
    fresh_manager.register(plugin, name="thirdparty_backend")
    with pytest.raises(PluginError) as info:
        backends.profiles()
    assert "thirdparty_backend" in str(info.value)
    assert says in str(info.value)

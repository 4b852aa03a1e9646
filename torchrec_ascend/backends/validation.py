"""Checks a :class:`~torchrec_ascend.backends.profile.DeviceProfile` field by field when it is created.

A third-party profile that misspells a sharding type would otherwise be silently ignored by the allow-list hooks
(they intersect the profile with TorchRec's lists). The vocabularies below are TorchRec's and fbgemm's names for the
supported versions; ``tests/backends/test_profile_validation.py`` checks them against the installed enums, so a new
TorchRec minor that adds a name fails a test instead of being refused here.

Example::

    dataclasses.replace(CPU, sharding_types=("row_wize",))
    # ConfigError: device backend profile 'cpu': field 'sharding_types': unknown value 'row_wize' (did you mean
    # 'row_wise'?); known: column_wise, data_parallel, ...
"""

from __future__ import annotations

import difflib
import re
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from torchrec_ascend.errors import ConfigError

if TYPE_CHECKING:
    from torchrec_ascend.backends.profile import DeviceProfile

#: ``torchrec.distributed.types.ShardingType`` values.
SHARDING_TYPES = frozenset(
    {"data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise", "table_column_wise", "grid_shard"}
)
#: ``torchrec.distributed.embedding_types.EmbeddingComputeKernel`` values (``unfused_tpu`` is new in 1.9).
COMPUTE_KERNELS = frozenset(
    {
        "dense",
        "fused",
        "fused_triton",
        "fused_uvm",
        "fused_uvm_caching",
        "quant",
        "quant_uvm",
        "quant_uvm_caching",
        "key_value",
        "customized_kernel",
        "ssd_virtual_table",
        "dram_virtual_table",
        "dram_ssd_virtual_table",
        "unfused_tpu",
    }
)
#: ``fbgemm_gpu.split_embedding_configs.EmbOptimType`` names (``ROWWISE_RMSPROP_AR`` is new in 1.9).
FUSED_OPTIMIZERS = frozenset(
    {
        "SGD",
        "EXACT_SGD",
        "LAMB",
        "ADAM",
        "EXACT_ADAGRAD",
        "EXACT_ROWWISE_ADAGRAD",
        "LARS_SGD",
        "PARTIAL_ROWWISE_ADAM",
        "PARTIAL_ROWWISE_LAMB",
        "ROWWISE_ADAGRAD",
        "SHAMPOO",
        "SHAMPOO_V2",
        "MADGRAD",
        "EXACT_ROWWISE_WEIGHTED_ADAGRAD",
        "ENSEMBLE_ROWWISE_ADAGRAD",
        "EMAINPLACE_ROWWISE_ADAGRAD",
        "ROWWISE_RMSPROP_AR",
        "NONE",
    }
)
#: ``torchrec.types.DataType`` names.
WEIGHT_DTYPES = frozenset({"FP32", "FP16", "BF16", "INT64", "INT32", "INT8", "UINT8", "INT4", "INT2", "NFP8"})
#: fbgemm ``EmbeddingLocation`` and ``ComputeDevice`` names.
TBE_LOCATIONS = frozenset({"DEVICE", "MANAGED", "MANAGED_CACHING", "HOST", "MTIA"})
TBE_COMPUTE_DEVICES = frozenset({"CPU", "CUDA", "MTIA"})
#: The train pipelines' stream roles (H4).
STREAM_ROLES = frozenset({"memcpy", "data_dist", "prefetch", "emb_lookup"})
#: Lookup kinds of a kernel override key ``"<kind>/<compute kernel>"`` (H2).
OVERRIDE_KINDS = frozenset({"pooled", "sequence"})

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
_MODULE_ATTR = re.compile(rf"{_DOTTED}:{_DOTTED}\Z")
_MODULE = re.compile(rf"{_DOTTED}\Z")


class _Checker:
    """Raises errors that name the profile and the field."""

    def __init__(self, profile_name: object) -> None:
        self.profile_name = profile_name

    def fail(self, field: str, problem: str) -> None:
        raise ConfigError(
            f"device backend profile {self.profile_name!r}: field {field!r}: {problem}; fix the DeviceProfile "
            f"returned by its torchrec_ascend_device_backends hook"
        )

    def text(self, field: str, value: Any, pattern: "re.Pattern[str] | None" = None, what: str = "") -> None:
        if not isinstance(value, str) or not value:
            self.fail(field, f"expected a non-empty string, got {value!r}")
        if pattern is not None and not pattern.match(value):
            self.fail(field, f"{value!r} is not {what}")

    def names(self, field: str, values: Any, known: "frozenset[str] | None" = None, empty_ok: bool = True) -> None:
        if not isinstance(values, tuple):
            self.fail(field, f"expected a tuple of strings, got {type(values).__name__}")
        if not values and not empty_ok:
            self.fail(field, "must not be empty")
        seen = set()
        for value in values:
            self.text(field, value)
            if value in seen:
                self.fail(field, f"{value!r} is listed twice")
            seen.add(value)
            if known is not None and value not in known:
                self.unknown(field, value, known)

    def unknown(self, field: str, value: str, known: Iterable[str]) -> None:
        known = sorted(known)
        close = difflib.get_close_matches(value, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        self.fail(field, f"unknown value {value!r}{hint}; known: {', '.join(known)}")

    def mapping(self, field: str, value: Any) -> Mapping[Any, Any]:
        if not isinstance(value, Mapping):
            self.fail(field, f"expected a mapping, got {type(value).__name__}")
        return value


def validate_profile(profile: "DeviceProfile") -> None:
    """Check every field of ``profile``; raise :class:`ConfigError` naming the profile and the first bad field.

    Args:
        profile: the profile to check (called by ``DeviceProfile.__post_init__``).

    Raises:
        ConfigError: a field has the wrong type, an unknown TorchRec/fbgemm name, or a malformed dotted path.
    """
    check = _Checker(profile.name)
    check.text("name", profile.name, _NAME, "a lower-case identifier")
    check.text("device_type", profile.device_type, _NAME, "a lower-case torch.device type")
    check.text("description", profile.description)
    check.text("collective_backend", profile.collective_backend, _NAME, "a torch.distributed backend name")
    if not isinstance(profile.priority, int) or isinstance(profile.priority, bool):
        check.fail("priority", f"expected an int, got {profile.priority!r}")
    if not callable(profile.detect):
        check.fail("detect", f"expected a callable returning bool, got {profile.detect!r}")
    check.names("sharding_types", profile.sharding_types, SHARDING_TYPES, empty_ok=False)
    check.names("compute_kernels", profile.compute_kernels, COMPUTE_KERNELS, empty_ok=False)
    check.names("fused_optimizers", profile.fused_optimizers, FUSED_OPTIMIZERS)
    check.names("weight_dtypes", profile.weight_dtypes, WEIGHT_DTYPES, empty_ok=False)
    check.names("requires_modules", profile.requires_modules)
    check.names("op_modules", profile.op_modules)
    check.names("optional_op_modules", profile.optional_op_modules)
    for field in ("requires_modules", "op_modules", "optional_op_modules"):
        for module in getattr(profile, field):
            check.text(field, module, _MODULE, "a dotted module name")
    check.names("host_fallback_ops", profile.host_fallback_ops)
    check.names("device_tbe_ops", profile.device_tbe_ops)
    check.names("process_group_classes", profile.process_group_classes)
    for target in profile.process_group_classes:
        check.text("process_group_classes", target, _MODULE_ATTR, "'module:qualname'")
    if profile.tbe.location not in TBE_LOCATIONS:
        check.unknown("tbe.location", profile.tbe.location, TBE_LOCATIONS)
    if profile.tbe.compute_device not in TBE_COMPUTE_DEVICES:
        check.unknown("tbe.compute_device", profile.tbe.compute_device, TBE_COMPUTE_DEVICES)
    if profile.streams is not None:
        check.text("streams.device_module", profile.streams.device_module, _MODULE, "a dotted module path")
        for role, priority in check.mapping("streams.priorities", profile.streams.priorities).items():
            if role not in STREAM_ROLES:
                check.unknown("streams.priorities", role, STREAM_ROLES)
            if not isinstance(priority, int):
                check.fail("streams.priorities", f"priority of {role!r} must be an int, got {priority!r}")
    planner = profile.planner
    if planner.alias is not None:
        check.text("planner.alias", planner.alias, _NAME, "a torch.device type")
    if planner.hbm_cap_bytes is not None and (not isinstance(planner.hbm_cap_bytes, int) or planner.hbm_cap_bytes <= 0):
        check.fail("planner.hbm_cap_bytes", f"expected a positive int or None, got {planner.hbm_cap_bytes!r}")
    for kernel, bandwidth in check.mapping("planner.kernel_bandwidths", planner.kernel_bandwidths).items():
        if kernel not in COMPUTE_KERNELS:
            check.unknown("planner.kernel_bandwidths", kernel, COMPUTE_KERNELS)
        if not isinstance(bandwidth, (int, float)) or bandwidth <= 0:
            check.fail("planner.kernel_bandwidths", f"bandwidth of {kernel!r} must be > 0 bytes/ms, got {bandwidth!r}")
    for key, target in check.mapping("kernel_overrides", profile.kernel_overrides).items():
        kind, _, kernel = str(key).partition("/")
        if kind not in OVERRIDE_KINDS or kernel not in COMPUTE_KERNELS:
            check.fail("kernel_overrides", f"key {key!r} is not '<pooled|sequence>/<compute kernel>'")
        check.text("kernel_overrides", target, _MODULE_ATTR, "'module:Class'")

"""DeviceProfile: everything that differs between devices, declared in one frozen record per backend.

The generic hooks (:mod:`torchrec_ascend.hooks`) and kernels ask the profile; no other module compares device
strings. A third party adds a device by returning a profile from the ``torchrec_ascend_device_backends`` hook.

Example::

    from torchrec_ascend.backends import profile_for
    profile_for("cpu").sharding_types   # ('data_parallel', 'table_wise', ..., 'row_wise', ...)
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional, Tuple

from torchrec_ascend.backends.validation import validate_profile

#: The device type TorchRec's allow-lists grant every sharding type and compute kernel to. A device gets the
#: entries of these lists that its profile declares (see :mod:`torchrec_ascend.hooks.sharding_allowlist`).
TORCHREC_REFERENCE_DEVICE = "cuda"


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    """How a device makes streams for the train pipelines (H4).

    Args:
        device_module: attribute path of the torch device module providing ``Stream``, ``Event``, ``stream()`` and
            ``current_stream()`` (e.g. ``"torch.npu"``).
        priorities: pipeline stream role -> stream priority (roles: ``memcpy``, ``data_dist``, ``prefetch``,
            ``emb_lookup``). Lower is more urgent.
        managed_by_torchrec: TorchRec already creates this device's streams itself (cuda); the hooks leave it be.
    """

    device_module: str
    priorities: Mapping[str, int]
    managed_by_torchrec: bool = False


@dataclasses.dataclass(frozen=True)
class PlannerSpec:
    """Planner constants for a device (H3).

    Args:
        alias: device type the stock planner should plan as (it only knows cpu, cuda and mtia); placements are
            rewritten back to the real device type. None: plan as the device itself.
        hbm_cap_bytes: device memory per device; None keeps TorchRec's default.
        kernel_bandwidths: compute kernel -> lookup bandwidth in bytes/ms, for kernels TorchRec has no figure for.
    """

    alias: Optional[str] = None
    hbm_cap_bytes: Optional[int] = None
    kernel_bandwidths: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TbeSpec:
    """Where fbgemm's table-batched embedding (TBE) keeps its weights on this device.

    Args:
        location: fbgemm ``EmbeddingLocation`` name (``"HOST"`` on CPU, ``"DEVICE"`` on accelerators).
        compute_device: fbgemm ``ComputeDevice`` name (``"CPU"``, ``"CUDA"``).
    """

    location: str
    compute_device: str


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """A device backend, declared.

    Args:
        name: backend name used by the override ``TORCHREC_ASCEND_DEVICE``.
        device_type: the ``torch.device`` type string.
        description: one line for ``doctor``.
        collective_backend: torch.distributed backend for this device (gloo, nccl, hccl).
        priority: automatic selection tries higher priorities first.
        detect: returns True if the device looks present (cheap; must not import heavy modules).
        requires_modules: modules imported, in order, when the backend is activated (e.g. ``torch_npu``).
        op_modules: modules imported after those to register fbgemm sparse ops for the device (H6).
        host_fallback_ops: ``fbgemm::`` ops that run through a host round trip when the device lacks a kernel.
        optional_op_modules: device-kernel libraries imported after ``op_modules`` if they load (e.g.
            ``fbgemm_ascend``); a failure is recorded (``doctor`` shows it) and their ops use the host fallback.
        device_tbe_ops: ``fbgemm::`` ops a table-batched embedding on the device needs a device kernel for;
            without them, planning embedding tables on the device is refused (H6).
        sharding_types: TorchRec sharding types the device supports (H1).
        compute_kernels: compute kernels offered for model-parallel sharding types (data_parallel uses dense).
        fused_optimizers: fbgemm ``EmbOptimType`` names that can be fused into backward on this device.
        weight_dtypes: TorchRec ``DataType`` names of the table weights its fused and KEY_VALUE kernels hold
            (optimizer state stays FP32); another ``data_type`` is refused when the model is sharded.
        tbe: fbgemm TBE placement.
        streams: stream factory for pipelines; None if the device has no streams (CPU).
        planner: planner constants.
        kernel_overrides: ``"<pooled|sequence>/<compute kernel>"`` -> ``"module:Class"`` of a kernel replacing
            the stock one on this device (H2).
        process_group_classes: ``"module:qualname"`` of the device's c10d backend classes, shared rather than
            deep-copied by ``DistributedModelParallel.copy()`` (H5). Resolved only once their module is imported.
        installed_with: pip requirement that provides the device stack, shown in error messages.

    Raises:
        ConfigError: a field is malformed or names something TorchRec/fbgemm does not know (the message names the
            profile and the field; see :mod:`torchrec_ascend.backends.validation`).

    Example::

        DeviceProfile(name="cpu", device_type="cpu", description="CPU", collective_backend="gloo", priority=0,
                      detect=lambda: True, sharding_types=("table_wise",), compute_kernels=("fused",),
                      fused_optimizers=("EXACT_SGD",), tbe=TbeSpec(location="HOST", compute_device="CPU"))
    """

    name: str
    device_type: str
    description: str
    collective_backend: str
    priority: int
    detect: Callable[[], bool]
    sharding_types: Tuple[str, ...]
    compute_kernels: Tuple[str, ...]
    fused_optimizers: Tuple[str, ...]
    tbe: TbeSpec
    planner: PlannerSpec = PlannerSpec()
    streams: Optional[StreamSpec] = None
    requires_modules: Tuple[str, ...] = ()
    op_modules: Tuple[str, ...] = ()
    host_fallback_ops: Tuple[str, ...] = ()
    optional_op_modules: Tuple[str, ...] = ()
    device_tbe_ops: Tuple[str, ...] = ()
    kernel_overrides: Mapping[str, str] = dataclasses.field(default_factory=dict)
    process_group_classes: Tuple[str, ...] = ()
    installed_with: str = ""
    weight_dtypes: Tuple[str, ...] = ("FP32", "FP16")

    def __post_init__(self) -> None:
        # A misspelled name would otherwise be dropped silently by the allow-list hooks.
        validate_profile(self)

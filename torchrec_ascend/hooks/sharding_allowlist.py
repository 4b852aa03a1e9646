"""H1: which sharding types and compute kernels a device supports, and planning for devices the planner lacks.

Stock TorchRec hard-codes ``{"cuda"}`` in ``BaseEmbeddingSharder.sharding_types``/``compute_kernels``: row-wise,
table-row-wise and grid sharding are refused on CPU although every op they need works there, and an unknown device
such as ``npu`` gets nothing. Here the backend profile of the device type decides (extending the stock lists).
The stock planner only knows cpu/cuda/mtia: a profile with ``planner.alias`` is planned as that device and its
placements are rewritten to the real device type.
"""

from __future__ import annotations

from typing import Any, Callable, List

from torchrec_ascend import backends
from torchrec_ascend.hooks.versions import TORCHREC_1_8
from torchrec_ascend.injection.patch import Patch

_SHARDER = "torchrec.distributed.embedding_types:BaseEmbeddingSharder"
_REAL_DEVICE_ATTR = "_torchrec_ascend_device_type"


def _extend(stock: List[str], extra: Any) -> List[str]:
    return list(stock) + [x for x in extra if x not in stock]


def _sharding_types(original: Callable[..., List[str]]) -> Callable[..., List[str]]:
    def sharding_types(self: Any, compute_device_type: str) -> List[str]:
        stock = original(self, compute_device_type)
        profile = backends.profile_for(compute_device_type)
        return stock if profile is None else _extend(stock, profile.sharding_types)

    return sharding_types


def _compute_kernels(original: Callable[..., List[str]]) -> Callable[..., List[str]]:
    def compute_kernels(self: Any, sharding_type: str, compute_device_type: str) -> List[str]:
        stock = original(self, sharding_type, compute_device_type)
        profile = backends.profile_for(compute_device_type)
        if profile is None or sharding_type == "data_parallel":
            return stock
        return _extend(stock, profile.compute_kernels)

    return compute_kernels


def _topology_init(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, world_size: int, compute_device: str, *args: Any, **kwargs: Any) -> None:
        profile = backends.profile_for(compute_device)
        alias = profile.planner.alias if profile is not None else None
        if alias:
            if kwargs.get("hbm_cap") is None and profile.planner.hbm_cap_bytes is not None and not args:
                kwargs["hbm_cap"] = profile.planner.hbm_cap_bytes
            original(self, world_size, alias, *args, **kwargs)
            setattr(self, _REAL_DEVICE_ATTR, compute_device)
        else:
            original(self, world_size, compute_device, *args, **kwargs)

    return __init__


def _to_sharding_plan(original: Callable[..., Any]) -> Callable[..., Any]:
    def to_sharding_plan(sharding_options: Any, topology: Any) -> Any:
        plan = original(sharding_options, topology)
        real = getattr(topology, _REAL_DEVICE_ATTR, None)
        if real is not None:
            _rewrite_placements(plan, topology.compute_device, real)
        return plan

    return to_sharding_plan


def _rewrite_placements(plan: Any, planned_as: str, real: str) -> None:
    from torch.distributed._remote_device import _remote_device

    for module_plan in plan.plan.values():
        for param_sharding in module_plan.values():
            spec = param_sharding.sharding_spec
            for shard in getattr(spec, "shards", None) or []:
                placement = str(shard.placement)
                if f"/{planned_as}" in placement:
                    shard.placement = _remote_device(placement.replace(f"/{planned_as}", f"/{real}"))


def _get_device_type(original: Callable[[], str]) -> Callable[[], str]:
    def get_device_type() -> str:
        return backends.active().device_type

    return get_device_type


PATCHES = [
    Patch.wrap(
        name="h1.sharder_sharding_types",
        target=f"{_SHARDER}.sharding_types",
        requires=TORCHREC_1_8,
        reason="row-wise/table-row-wise/grid sharding are refused outside cuda by an allow-list, not by capability",
        wrapper=_sharding_types,
    ),
    Patch.wrap(
        name="h1.sharder_compute_kernels",
        target=f"{_SHARDER}.compute_kernels",
        requires=TORCHREC_1_8,
        reason="key_value (and accelerator kernels) are offered only on cuda; the profile lists each device's",
        wrapper=_compute_kernels,
    ),
    Patch.wrap(
        name="h1.topology_device_alias",
        target="torchrec.distributed.planner.types:Topology.__init__",
        requires=TORCHREC_1_8,
        reason="Topology asserts compute_device in cpu/cuda/mtia; plan other accelerators with cuda's HBM rules",
        wrapper=_topology_init,
    ),
    Patch.wrap(
        name="h1.plan_placement_device",
        target="torchrec.distributed.planner.planners:to_sharding_plan",
        requires=TORCHREC_1_8,
        reason="placements of an aliased device must name the real device (rank:r/npu:i)",
        wrapper=_to_sharding_plan,
    ),
    Patch.wrap(
        name="h1.planner_default_device",
        target="torchrec.distributed.planner.planners:get_device_type",
        requires=TORCHREC_1_8,
        reason="a planner built without a topology must default to the active backend's device",
        wrapper=_get_device_type,
    ),
    Patch.wrap(
        name="h1.sharding_plan_default_device",
        target="torchrec.distributed.sharding_plan:get_device_type",
        requires=TORCHREC_1_8,
        reason="construct_module_sharding_plan without a device must default to the active backend's device",
        wrapper=_get_device_type,
    ),
]

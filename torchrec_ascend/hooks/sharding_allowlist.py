"""H1: which sharding types and compute kernels a device supports, and planning for devices the planner lacks.

Stock TorchRec hard-codes ``{"cuda"}`` in the sharders' ``sharding_types``/``compute_kernels``: row-wise,
table-row-wise and grid sharding are refused on CPU although every op they need works there, and an unknown device
such as ``npu`` gets nothing. The rule here, for every cuda-gated sharder (``BaseEmbeddingSharder`` and
``FusedEmbeddingBagCollectionSharder``): a device keeps what the sharder offers it, plus those entries of the
sharder's cuda list that the device's profile declares. The managed-collision sharder offers a fixed kernel list
whatever the device; it is filtered to the profile's kernels.

The stock planner only knows cpu/cuda/mtia: a profile with ``planner.alias`` is planned as that device and its
placements are rewritten to the real device type. The sharders then see the alias; in a process whose active
backend plans as that alias, the active backend's rules apply (an npu host plans npu, never cuda).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

from torchrec_ascend import backends
from torchrec_ascend.backends.profile import TORCHREC_REFERENCE_DEVICE, DeviceProfile
from torchrec_ascend.hooks import sparse_ops
from torchrec_ascend.injection.patch import Patch
from torchrec_ascend.versions import TORCHREC, TORCHREC_FBGEMM

_SHARDER = "torchrec.distributed.embedding_types:BaseEmbeddingSharder"
_FUSED_SHARDER = "torchrec.distributed.fused_embeddingbag:FusedEmbeddingBagCollectionSharder"
_MC_SHARDER = "torchrec.distributed.mc_embedding_modules:BaseManagedCollisionEmbeddingCollectionSharder"
_REAL_DEVICE_ATTR = "_torchrec_ascend_device_type"


def planning_profile(device_type: str) -> Optional[DeviceProfile]:
    """The profile whose rules apply to ``device_type`` as sharders and the planner see it, or None (stock rules).

    Args:
        device_type: the device type a sharder is asked about (an alias such as ``"cuda"`` for npu planning).

    Example::

        planning_profile("cpu").name    # 'cpu'
        planning_profile("cuda").name   # 'npu' in a process whose active backend is npu, else 'cuda'
    """
    current = backends.active()
    if current.planner.alias == device_type:
        return current
    return backends.profile_for(device_type)


def granted(
    query: Callable[[str], List[str]], device_type: str, declared: Callable[[DeviceProfile], Sequence[str]]
) -> List[str]:
    """What a cuda-gated allow-list grants ``device_type``: its own answer plus the declared part of cuda's.

    Args:
        query: the stock allow-list, as a function of the device type.
        device_type: the device type asked about.
        declared: what the device's profile declares (its ``sharding_types`` or ``compute_kernels``).

    Example::

        granted(lambda d: sharder.sharding_types(d), "cpu", lambda p: p.sharding_types)
        # ['data_parallel', 'table_wise', 'column_wise', 'table_column_wise', 'row_wise', ...]
    """
    profile = planning_profile(device_type)
    if profile is None:
        return query(device_type)
    own = query(profile.device_type)
    supported = declared(profile)
    return own + [x for x in query(TORCHREC_REFERENCE_DEVICE) if x in supported and x not in own]


def _sharding_types(original: Callable[..., List[str]]) -> Callable[..., List[str]]:
    def sharding_types(self: Any, compute_device_type: str) -> List[str]:
        return granted(lambda device: original(self, device), compute_device_type, lambda p: p.sharding_types)

    return sharding_types


def _compute_kernels(original: Callable[..., List[str]]) -> Callable[..., List[str]]:
    def compute_kernels(self: Any, sharding_type: str, compute_device_type: str) -> List[str]:
        profile = planning_profile(compute_device_type)
        if profile is not None and sharding_type != "data_parallel":
            sparse_ops.require_device_tbe(profile, sharding_type)  # H6: refused, naming the missing op
        return granted(
            lambda device: original(self, sharding_type, device), compute_device_type, lambda p: p.compute_kernels
        )

    return compute_kernels


def _device_filtered_kernels(original: Callable[..., List[str]]) -> Callable[..., List[str]]:
    def compute_kernels(self: Any, sharding_type: str, compute_device_type: str) -> List[str]:
        stock = original(self, sharding_type, compute_device_type)
        profile = planning_profile(compute_device_type)
        return stock if profile is None else [k for k in stock if k in profile.compute_kernels]

    return compute_kernels


def _topology_init(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, world_size: int, compute_device: str, *args: Any, **kwargs: Any) -> None:
        profile = backends.profile_for(compute_device)
        alias = profile.planner.alias if profile is not None else None
        if alias and profile is not None:
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
    for module_plan in plan.plan.values():
        for param_sharding in module_plan.values():
            for shard in getattr(param_sharding.sharding_spec, "shards", None) or []:
                shard.placement = _on_device(shard.placement, planned_as, real)


def _on_device(placement: Any, planned_as: str, real: str) -> Any:
    """``rank:r/<planned_as>:i`` as ``rank:r/<real>:i`` (other placements unchanged)."""
    from torch.distributed.remote_device import _remote_device

    remote = placement if isinstance(placement, _remote_device) else _remote_device(placement)
    device = remote.device()
    if device.type != planned_as:
        return placement
    moved = _remote_device(f"rank:{remote.rank()}/{real}:{device.index}")
    return moved if isinstance(placement, _remote_device) else str(moved)


def _placement(original: Callable[[str, int, int], str]) -> Callable[[str, int, int], str]:
    def placement(compute_device: str, rank: int, local_size: int) -> str:
        profile = backends.profile_for(compute_device)
        alias = profile.planner.alias if profile is not None else None
        if not alias:
            return original(compute_device, rank, local_size)
        return _on_device(original(alias, rank, local_size), alias, compute_device)

    return placement


def _get_device_type(original: Callable[[], str]) -> Callable[[], str]:
    def get_device_type() -> str:
        return backends.active().device_type

    return get_device_type


PATCHES = [
    Patch.wrap(
        name="h1.sharder_sharding_types",
        target=f"{_SHARDER}.sharding_types",
        requires=TORCHREC_FBGEMM,
        reason="row-wise/table-row-wise/grid sharding are refused outside cuda by an allow-list, not by capability",
        wrapper=_sharding_types,
    ),
    Patch.wrap(
        name="h1.sharder_compute_kernels",
        target=f"{_SHARDER}.compute_kernels",
        requires=TORCHREC,
        reason="key_value (and accelerator kernels) are offered only on cuda; the profile lists each device's",
        wrapper=_compute_kernels,
    ),
    Patch.wrap(
        name="h1.fused_sharder_sharding_types",
        target=f"{_FUSED_SHARDER}.sharding_types",
        requires=TORCHREC_FBGEMM,
        reason="FusedEmbeddingBagCollectionSharder allows row-wise/table-row-wise on cuda only",
        wrapper=_sharding_types,
    ),
    Patch.wrap(
        name="h1.fused_sharder_compute_kernels",
        target=f"{_FUSED_SHARDER}.compute_kernels",
        requires=TORCHREC,
        reason="FusedEmbeddingBagCollectionSharder gates its kernels on cuda; the profile lists each device's",
        wrapper=_compute_kernels,
    ),
    Patch.wrap(
        name="h1.mc_sharder_compute_kernels",
        target=f"{_MC_SHARDER}.compute_kernels",
        requires=TORCHREC,
        reason="the managed-collision sharder offers UVM kernels on every device; keep the device's own",
        wrapper=_device_filtered_kernels,
    ),
    Patch.wrap(
        name="h1.topology_device_alias",
        target="torchrec.distributed.planner.types:Topology.__init__",
        requires=TORCHREC,
        reason="Topology asserts compute_device in cpu/cuda/mtia; plan other accelerators with cuda's HBM rules",
        wrapper=_topology_init,
    ),
    Patch.wrap(
        name="h1.plan_placement_device",
        target="torchrec.distributed.planner.planners:to_sharding_plan",
        requires=TORCHREC,
        reason="placements of an aliased device must name the real device (rank:r/npu:i)",
        wrapper=_to_sharding_plan,
    ),
    Patch.wrap(
        name="h1.explicit_plan_placement",
        target="torchrec.distributed.sharding_plan:placement",
        requires=TORCHREC,
        reason="explicit plans give an aliased device no index (rank:r/npu), which ShardedTensor rejects",
        wrapper=_placement,
    ),
    Patch.wrap(
        name="h1.planner_default_device",
        target="torchrec.distributed.planner.planners:get_device_type",
        requires=TORCHREC,
        reason="a planner built without a topology must default to the active backend's device",
        wrapper=_get_device_type,
    ),
    Patch.wrap(
        name="h1.sharding_plan_default_device",
        target="torchrec.distributed.sharding_plan:get_device_type",
        requires=TORCHREC,
        reason="construct_module_sharding_plan without a device must default to the active backend's device",
        wrapper=_get_device_type,
    ),
]

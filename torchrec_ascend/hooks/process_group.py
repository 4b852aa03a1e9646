"""H5: process-group plumbing. ``DistributedModelParallel.copy()`` on torch builds without NCCL (CPU, NPU).

``sharded_model_copy`` marks process groups and streams as not-to-be-deep-copied by naming
``ProcessGroupNCCL`` and ``torch.cuda`` streams, which a CPU-only or NPU build of torch does not have, and its
``__exit__`` leaves ``__deepcopy__ = None`` behind. Ours marks the generic c10d classes, every backend's declared
process-group classes and stream class (those whose module is imported: no instance of the others can exist), and
restores exactly what it changed. Collectives themselves need nothing: TorchRec inherits the backend (gloo, nccl,
hccl) from the user's process group.

Not covered: ``dist_data._check_pg_for_nccl_error`` probes only NCCL (it returns quietly for other backends).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from torchrec_ascend import backends
from torchrec_ascend.dotted import resolve_object
from torchrec_ascend.injection.patch import Patch, set_attribute
from torchrec_ascend.versions import TORCHREC

# Device-independent c10d classes whose instances a sharded module may hold.
_C10D = "torch._C._distributed_c10d"
_GENERIC_CLASSES = (f"{_C10D}:ProcessGroup", f"{_C10D}:Backend", f"{_C10D}:Work")
_UNDO_ATTR = "_torchrec_ascend_undo"


def loaded_object(target: str) -> Optional[Any]:
    """The object at ``"module:qualname"`` (or ``"module.attr"``) if its module is already imported, else None.

    Nothing is imported: a class of a module nobody imported has no instances to worry about.

    Example::

        loaded_object("torch._C._distributed_c10d:ProcessGroupGloo")   # the class, once torch is imported
        loaded_object("torch_npu._C._distributed_c10d:ProcessGroupHCCL")   # None without torch_npu
    """
    return resolve_object(target, imported_only=True)


def no_copy_classes() -> List[type]:
    """Classes whose instances ``sharded_model_copy`` must share rather than deep-copy.

    Example::

        torch._C._distributed_c10d.ProcessGroupGloo in no_copy_classes()   # True
    """
    names = list(_GENERIC_CLASSES)
    for profile in backends.profiles().values():
        names += profile.process_group_classes
        if profile.streams is not None:
            names.append(f"{profile.streams.device_module}.Stream")
    found: List[type] = []
    for name in names:
        cls = loaded_object(name)
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return found


def _enter(original: Callable[..., None]) -> Callable[..., None]:
    def __enter__(self: Any) -> None:
        import torch

        device = self.device

        def tensor_copy(tensor: Any, memo: Any) -> Any:
            return tensor.detach().to(device) if tensor.device != device else tensor.detach().clone()

        def no_copy(obj: Any, memo: Any) -> Any:
            return obj

        copy_or_not = tensor_copy if device is not None else no_copy

        def param_copy(param: Any, memo: Any) -> Any:
            return torch.nn.Parameter(copy_or_not(param, memo), requires_grad=param.requires_grad)

        undo = [
            set_attribute(torch.Tensor, "__deepcopy__", copy_or_not),
            set_attribute(torch.nn.Parameter, "__deepcopy__", param_copy),
        ]
        undo += [set_attribute(cls, "__deepcopy__", no_copy) for cls in no_copy_classes()]
        setattr(self, _UNDO_ATTR, undo)

    return __enter__


def _exit(original: Callable[..., None]) -> Callable[..., None]:
    def __exit__(self: Any, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        for undo in reversed(getattr(self, _UNDO_ATTR, [])):
            undo()
        setattr(self, _UNDO_ATTR, [])

    return __exit__


PATCHES = [
    Patch.wrap(
        name="h5.model_copy_enter",
        target="torchrec.distributed.utils:sharded_model_copy.__enter__",
        requires=TORCHREC,
        reason="DMP.copy() names ProcessGroupNCCL and torch.cuda streams, absent on CPU-only and NPU torch builds",
        wrapper=_enter,
    ),
    Patch.wrap(
        name="h5.model_copy_exit",
        target="torchrec.distributed.utils:sharded_model_copy.__exit__",
        requires=TORCHREC,
        reason="undo exactly what the patched __enter__ marked",
        wrapper=_exit,
    ),
]

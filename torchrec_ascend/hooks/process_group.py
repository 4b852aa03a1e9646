"""H5: process-group plumbing. ``DistributedModelParallel.copy()`` on torch builds without NCCL (CPU, NPU).

``sharded_model_copy`` marks process groups and streams as not-to-be-deep-copied by naming
``ProcessGroupNCCL`` and ``torch.cuda`` streams, which a CPU-only or NPU build of torch does not have. Ours marks
whatever process-group classes exist and every backend's stream class. Collectives themselves need nothing: TorchRec
inherits the backend (gloo, nccl, hccl) from the user's process group.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, List

from torchrec_ascend import backends
from torchrec_ascend.hooks.versions import TORCHREC_1_8
from torchrec_ascend.injection.patch import Patch

_PROCESS_GROUP_CLASSES = ("ProcessGroup", "ProcessGroupNCCL", "ProcessGroupGloo", "ProcessGroupHCCL", "Work")


def no_copy_classes() -> List[type]:
    """Classes whose instances ``sharded_model_copy`` must share rather than deep-copy."""
    import torch

    c10d = torch._C._distributed_c10d
    found = [getattr(c10d, name) for name in _PROCESS_GROUP_CLASSES if hasattr(c10d, name)]
    for profile in backends.profiles().values():
        if profile.streams is None:
            continue
        module_name, _, attr = profile.streams.device_module.rpartition(".")
        try:
            stream = getattr(getattr(importlib.import_module(module_name), attr), "Stream")
        except (ImportError, AttributeError):  # that device's stack is not installed here
            continue
        found.append(stream)
    return found


def _enter(original: Callable[..., None]) -> Callable[..., None]:
    def __enter__(self: Any) -> None:
        import torch

        self.t_copy_save_ = torch.Tensor.__deepcopy__
        self.p_copy_save_ = torch.nn.Parameter.__deepcopy__
        device = self.device

        def tensor_copy(tensor: Any, memo: Any) -> Any:
            return tensor.detach().to(device) if tensor.device != device else tensor.detach().clone()

        def no_copy(obj: Any, memo: Any) -> Any:
            return obj

        copy_or_not = tensor_copy if device is not None else no_copy

        def param_copy(param: Any, memo: Any) -> Any:
            return torch.nn.Parameter(copy_or_not(param, memo), requires_grad=param.requires_grad)

        torch.Tensor.__deepcopy__ = copy_or_not
        torch.nn.Parameter.__deepcopy__ = param_copy
        self._torchrec_ascend_no_copy = no_copy_classes()
        for cls in self._torchrec_ascend_no_copy:
            cls.__deepcopy__ = no_copy

    return __enter__


def _exit(original: Callable[..., None]) -> Callable[..., None]:
    def __exit__(self: Any, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        import torch

        torch.Tensor.__deepcopy__ = self.t_copy_save_
        torch.nn.Parameter.__deepcopy__ = self.p_copy_save_
        for cls in getattr(self, "_torchrec_ascend_no_copy", []):
            cls.__deepcopy__ = None

    return __exit__


PATCHES = [
    Patch.wrap(
        name="h5.model_copy_enter",
        target="torchrec.distributed.utils:sharded_model_copy.__enter__",
        requires=TORCHREC_1_8,
        reason="DMP.copy() names ProcessGroupNCCL and torch.cuda streams, absent on CPU-only and NPU torch builds",
        wrapper=_enter,
    ),
    Patch.wrap(
        name="h5.model_copy_exit",
        target="torchrec.distributed.utils:sharded_model_copy.__exit__",
        requires=TORCHREC_1_8,
        reason="undo exactly what the patched __enter__ marked",
        wrapper=_exit,
    ),
]

"""H5: the ``.device`` of a ShardedTensor that holds no shard on this rank, on PrivateUse1 devices (the NPU).

torch answers ``ShardedTensor.device`` with its ``tensor_device`` op: the first local shard's device; for a rank
without shards, ``cpu`` on a gloo group and ``torch.cuda.current_device()`` on any other group. A device backend's
group (``cpu:gloo,npu:hccl``) is not gloo, so on a build without CUDA a rank holding no shard of a table raises
"Torch not compiled with CUDA" (DCP's state_dict planning asks every rank), and the other ranks wait for it forever.

The patch swaps that op's entry in torch's ShardedTensor op table (a registry entry like H6: no TorchRec source) for
one that, only in that case (no local shard, a non-gloo group, the active backend a PrivateUse1 device), answers the
active backend's current device (``torch.accelerator``); every other case is torch's own op. The undo puts torch's
entry back.

Example::

    with PatchRegistry([sharded_tensor_device_patch()]):
        empty_on_this_rank.device   # device(type='npu', index=0) where torch would call torch.cuda
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from torchrec_ascend.injection.patch import Patch, Undo
from torchrec_ascend.versions import supported_range

_MODULE = "torch.distributed._shard.sharded_tensor"


def privateuse1_device(pg: Any) -> Optional[Any]:
    """The active backend's current device, when torch's answer for a rank without shards on ``pg`` would name
    CUDA on a PrivateUse1 device (``pg`` not gloo); None otherwise.

    Example::

        privateuse1_device(npu_group)   # device(type='npu', index=0) on the emulated npu; None on CPU or CUDA
    """
    import torch

    from torchrec_ascend import backends

    device_type = backends.active().device_type
    if device_type != torch._C._get_privateuse1_backend_name() or (pg is not None and pg._get_backend_name() == "gloo"):
        return None
    return torch.device(device_type, torch.accelerator.current_device_index())


def _device_op(original: Callable[..., Any]) -> Callable[..., Any]:
    def tensor_device(types: Any, args: Any = (), kwargs: Any = None, pg: Any = None) -> Any:
        if args and not getattr(args[0], "_local_shards", True):
            device = privateuse1_device(pg)
            if device is not None:
                return device
        return original(types, args, kwargs, pg)

    return tensor_device


def sharded_tensor_device_patch() -> Patch:
    """The registry entry replacing torch's ``ShardedTensor.device`` op for ranks without shards (see module doc).

    Example::

        undo = sharded_tensor_device_patch().apply(); undo()   # torch's op is back in its table
    """

    def apply_fn(patch: Patch) -> Undo:
        import importlib

        import torch

        table = importlib.import_module(_MODULE)._SHARDED_OPS
        key = torch.Tensor.device.__get__  # the op table's key for .device
        original = table[key]
        table[key] = _device_op(original)

        def undo() -> None:
            table[key] = original

        return undo

    return Patch(
        name="h5.sharded_tensor_device",
        target=f"{_MODULE}:_SHARDED_OPS",
        requires={"torch": supported_range("torch")},
        reason="a rank holding no shard of a ShardedTensor answers .device with torch.cuda on non-gloo groups",
        apply_fn=apply_fn,
    )


#: The registry entries of this module (applied with the other registrations, before the TorchRec patches).
REGISTRATIONS = [sharded_tensor_device_patch()]

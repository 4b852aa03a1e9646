"""fbgemm's TBE training lookups on the emulated NPU: the accelerator layout run by fbgemm's CPU kernels.

fbgemm's TBE (``SplitTableBatchedEmbeddingBagsCodegen``) with ``EmbeddingLocation.DEVICE`` calls
``fbgemm::split_embedding_codegen_lookup_<optimizer>_function_pt2`` with the accelerator layout of its state
(``[dev, uvm, placements, offsets(, lxu_cache)]``); its autograd kernel accepts only CUDA/MTIA tensors there. On
the emulator each such op gets an ``AutogradPrivateUse1`` kernel that hands fbgemm's CPU path host aliases of the
same device memory in the CPU layout (``[host, placements, offsets]``) and bridges autograd: the backward runs
fbgemm's fused CPU backward, whose optimizer update lands in the device tensors. Forward output and gradients
move between the two without counted traffic (on hardware they never leave the device). A host alias does not
own its memory: the bridge holds every device tensor it aliased (the lookup's arguments until the backward has
run, the gradient until fbgemm's backward returns), else the allocator reuses the memory under fbgemm's saved
indices or its gradient (seen as garbage rows after a ``.sum().backward()``, whose gradient is a temporary).

Example::

    tbe = SplitTableBatchedEmbeddingBagsCodegen([(rows, dim, EmbeddingLocation.DEVICE, ComputeDevice.CUDA)],
                                                device=torch.device("npu"))
    tbe(indices.npu(), offsets.npu()).sum().backward()   # SGD step applied to tbe.weights_dev on the npu
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

_PREFIX = "fbgemm::split_embedding_codegen_lookup_"
_SUFFIX = "_function_pt2"
_libraries: List[Any] = []


def _ext() -> Any:
    from torchrec_ascend.testing import _emulator

    return _emulator


def _host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _ext().host_alias(value) if value.device.type == "npu" else value
    if isinstance(value, (list, tuple)):
        return type(value)(_host(v) for v in value)
    return value


def _cpu_layout(name: str, value: Any) -> Any:
    """The accelerator layout of a TBE state list, as the CPU kernels take it."""
    if not isinstance(value, (list, tuple)) or not value or not isinstance(value[0], torch.Tensor):
        return value
    if name == "weights" and len(value) == 5:  # dev, uvm, placements, offsets, lxu_cache
        return [value[0], value[2], value[3]]
    if len(value) == 4:  # optimizer state: dev, uvm, placements, offsets
        return [value[0], value[2], value[3]]
    return value


class _Bridge(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, placeholder: torch.Tensor, run: Any, aliased: Any) -> torch.Tensor:
        with torch.enable_grad():
            host_out = run()
        ctx.host_out = host_out
        ctx.aliased = aliased  # fbgemm saved host aliases of these for its backward
        return _ext().device_copy(host_out.detach(), placeholder.device.index or 0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[None, None, None]:
        host_out = ctx.host_out
        del ctx.host_out
        if host_out.requires_grad:
            dense = grad.contiguous()  # may be a temporary: held while fbgemm reads its alias
            host_out.backward(_host(dense))
        del ctx.aliased
        return None, None, None


def _kernel(op: Any) -> Any:
    names = [a.name for a in op._schema.arguments]

    def lookup(*args: Any, **kwargs: Any) -> torch.Tensor:
        host_args = [_host(_cpu_layout(names[i], a)) for i, a in enumerate(args)]
        host_kwargs: Dict[str, Any] = {k: _host(_cpu_layout(k, v)) for k, v in kwargs.items()}
        placeholder = args[0] if args else kwargs["placeholder_autograd_tensor"]
        host_placeholder = torch.zeros(0, dtype=placeholder.dtype, requires_grad=placeholder.requires_grad)
        if args:
            host_args[0] = host_placeholder
        else:
            host_kwargs["placeholder_autograd_tensor"] = host_placeholder
        return _Bridge.apply(placeholder, lambda: op(*host_args, **host_kwargs), (args, kwargs))

    return lookup


def register() -> List[str]:
    """Give every TBE training lookup op an ``AutogradPrivateUse1`` kernel (once; returns the op names)."""
    if _libraries:
        return []
    done = []
    library = torch.library.Library("fbgemm", "IMPL")
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith(_PREFIX) and name.endswith(_SUFFIX):
            if torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutogradPrivateUse1"):
                continue
            op = getattr(torch.ops.fbgemm, name[len("fbgemm::"):]).default
            library.impl(name[len("fbgemm::"):], _kernel(op), "AutogradPrivateUse1")
            done.append(name)
    _libraries.append(library)
    return done

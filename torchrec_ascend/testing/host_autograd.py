"""Autograd on the emulated NPU for the fbgemm ops whose backward fbgemm registers per backend (``AutogradCPU``).

fbgemm registers the autograd of a few ops per dispatch key instead of for ``Autograd`` (for example
``permute_pooled_embs_auto_grad_split``, which TorchRec's column-wise output dist applies to the pooled embeddings;
fbgemm-ascend registers its own for the NPU). On the emulator such an op found no ``AutogradPrivateUse1`` kernel:
its forward ran the provided host kernel with no backward, so the gradient of everything below it was dropped with
only a warning (a column-wise table trained on part of its gradient). Each such op with one tensor result gets an
``AutogradPrivateUse1`` kernel here that runs fbgemm's ``AutogradCPU`` kernel over host aliases of the device
memory (no copy, no counted traffic: on hardware nothing leaves the device) and hands its input gradients back to
the device. Ops with list results (``group_index_select_dim0``) are not covered: no TorchRec path the suite drives
calls them.

Example::

    host_autograd.register()   # ['fbgemm::permute_pooled_embs_auto_grad_split', ...]
    out = torch.ops.fbgemm.permute_pooled_embs_auto_grad_split(pooled.npu().requires_grad_(), *lists)
    out.sum().backward()       # pooled's gradient, permuted back, on the npu
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch

_libraries: List[Any] = []


def _ext() -> Any:
    from torchrec_ascend.testing import _emulator

    return _emulator


def _alias(value: Any, needs_grad: bool) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "npu":
        return _ext().host_alias(value).detach().requires_grad_(needs_grad)
    return value


class _HostAutograd(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, op: Any, *args: Any) -> torch.Tensor:
        host = [_alias(a, need) for a, need in zip(args, ctx.needs_input_grad[1:])]
        with torch.enable_grad():
            out = op(*host)
        ctx.host_in, ctx.host_out, ctx.held = host, out, args  # held: a host alias owns no memory
        index = next(a.device.index or 0 for a in args if isinstance(a, torch.Tensor) and a.device.type == "npu")
        ctx.index = index
        return _ext().device_copy(out.detach(), index)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        wanted = [i for i, need in enumerate(ctx.needs_input_grad[1:]) if need]
        dense = grad.contiguous()  # may be a temporary: held while the host kernel reads its alias
        grads = torch.autograd.grad(ctx.host_out, [ctx.host_in[i] for i in wanted], _ext().host_alias(dense),
                                    allow_unused=True)
        out: List[Optional[torch.Tensor]] = [None] * len(ctx.host_in)
        for i, g in zip(wanted, grads):
            out[i] = None if g is None else _ext().device_copy(g, ctx.index)
        del ctx.host_in, ctx.host_out, ctx.held
        return (None, *out)


def _kernel(op: Any) -> Any:
    def run(*args: Any) -> torch.Tensor:
        return _HostAutograd.apply(op, *args)

    return run


# Ops whose CPU kernel builds its own autograd graph (no AutogradCPU kernel): fbgemm's dense TBE lookup, which
# TorchRec's data_parallel kernels call; on the emulator its host kernel ran below autograd and dropped the gradient.
_AUTOGRAD_IN_CPU_KERNEL = ("fbgemm::dense_embedding_codegen_lookup_function",)


def _covered(name: str) -> bool:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if name in _AUTOGRAD_IN_CPU_KERNEL:
        return not has(name, "AutogradPrivateUse1")
    if not has(name, "AutogradCPU") or has(name, "AutogradPrivateUse1") or has(name, "Autograd"):
        return False
    schema = torch._C._get_schema(name, "")
    return len(schema.returns) == 1 and str(schema.returns[0].type) == "Tensor"


def register() -> List[str]:
    """Give every fbgemm op with only a per-backend autograd (and one tensor result) an ``AutogradPrivateUse1``
    kernel (once; returns the op names)."""
    if _libraries:
        return []
    library = torch.library.Library("fbgemm", "IMPL")
    done = []
    for name in sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("fbgemm::")):
        if _covered(name):
            op = getattr(torch.ops.fbgemm, name[len("fbgemm::"):]).default
            library.impl(name[len("fbgemm::"):], _kernel(op), "AutogradPrivateUse1")
            done.append(name)
    _libraries.append(library)
    return done

"""H6: fbgemm sparse ops on devices that lack a kernel for them: a host round trip, registered with torch.library.

TorchRec's training path dispatches ``torch.ops.fbgemm.*`` ops (bucketize, permute, cumsum...) that have only CPU
and CUDA kernels in fbgemm_gpu. A device backend imports its own op library first (``op_modules``, e.g.
fbgemm_ascend); for each op in the profile's ``host_fallback_ops`` that still has no kernel for the device's dispatch
key, we register one that copies the inputs to the host, runs the CPU kernel and copies the outputs back. Slow but
correct; ``doctor`` lists which ops fell back.
"""

from __future__ import annotations

from typing import Any, Callable, List

from torchrec_ascend.backends.profile import DeviceProfile
from torchrec_ascend.errors import BackendError

# The dispatch key out-of-tree devices (torch_npu) register their kernels under.
DISPATCH_KEY = "PrivateUse1"
_libraries: List[Any] = []  # keep registrations alive for the life of the process
#: Qualified names of the ops given a host round trip in this process (shown by ``doctor``).
REGISTERED: List[str] = []


def host_round_trip(op: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``op`` so it runs on the host: tensor arguments go to CPU, tensor results return to their device.

    The device is that of the first tensor argument (CPU if there is none).

    Example::

        cumsum = host_round_trip(torch.ops.fbgemm.asynchronous_complete_cumsum.default)
        cumsum(lengths_on_npu)   # computed on the CPU, returned on the npu
    """
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    def run(*args: Any, **kwargs: Any) -> Any:
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        device = tensors[0].device if tensors else torch.device("cpu")

        def to_host(x: Any) -> Any:
            return x.cpu() if isinstance(x, torch.Tensor) else x

        def to_device(x: Any) -> Any:
            return x.to(device) if isinstance(x, torch.Tensor) else x

        return tree_map(to_device, op(*tree_map(to_host, args), **tree_map(to_host, kwargs)))

    return run


def register_host_fallbacks(profile: DeviceProfile, namespace: str = "fbgemm") -> List[str]:
    """Register host round trips for the profile's ``host_fallback_ops`` that lack a device kernel.

    Args:
        profile: the device backend (its ``host_fallback_ops``; the op library must be imported already, as
            ``backends.activate`` does with ``op_modules``).
        namespace: the op namespace.

    Returns:
        List[str]: the qualified op names registered now (also appended to :data:`REGISTERED`).

    Raises:
        BackendError: a listed op is not defined at all (its library was not imported, or the name is wrong).

    Example::

        register_host_fallbacks(backends.profile_for("npu"))   # ['fbgemm::block_bucketize_sparse_features', ...]
    """
    if not profile.host_fallback_ops:
        return []
    import torch

    library = torch.library.Library(namespace, "IMPL")
    done = []
    for name in profile.host_fallback_ops:
        qualified = f"{namespace}::{name}"
        try:
            has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key(qualified, DISPATCH_KEY)
        except RuntimeError as err:
            raise BackendError(
                f"device backend {profile.name!r} lists {qualified} in host_fallback_ops, but no such operator is "
                f"defined ({err}); import the library defining it first (add it to the profile's op_modules, "
                f"currently {list(profile.op_modules)}) or remove the name"
            ) from err
        if not has_kernel:
            op = getattr(getattr(torch.ops, namespace), name).default
            library.impl(name, host_round_trip(op), DISPATCH_KEY)
            done.append(qualified)
    _libraries.append(library)
    REGISTERED.extend(done)
    return done

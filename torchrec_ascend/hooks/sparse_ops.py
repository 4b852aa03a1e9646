"""H6: fbgemm sparse ops on devices that lack a kernel for them: a host round trip, registered with torch.library.

TorchRec's training path dispatches ``torch.ops.fbgemm.*`` ops (bucketize, permute, cumsum...) that have only CPU
and CUDA kernels in fbgemm_gpu. A device backend imports its own op library first (``op_modules``; an optional one,
``optional_op_modules`` such as fbgemm_ascend, may fail to load: the error is kept in :data:`LIBRARIES`); for each op
in the profile's ``host_fallback_ops`` that still has no kernel for the device's dispatch key, we register one that
copies the inputs to the host, runs the CPU kernel and copies the outputs back. Slow but correct: the first call of
each such op warns once, every call is counted (:func:`fallback_calls`), ``doctor`` lists per op device kernel or
host fallback. A device TBE cannot be emulated that way: :func:`require_device_tbe` refuses planning tables on a
device whose ``device_tbe_ops`` lack a kernel.

The registration is an entry of the patch registry (:data:`REGISTRATIONS`, ``h6.host_fallback_ops``): applied for
the active backend on the registry's first pass (while ``import torchrec`` runs), reverted by dropping the
``torch.library`` registrations it made, and listed by ``doctor`` with its state like every patch.

Example::

    register_host_fallbacks(backends.profile_for("npu"))   # ['fbgemm::block_bucketize_sparse_features', ...]
    fallback_calls()                                        # {'fbgemm::block_bucketize_sparse_features': 12, ...}
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

from torchrec_ascend.backends.profile import DeviceProfile
from torchrec_ascend.errors import BackendError, ConfigError
from torchrec_ascend.injection.patch import Patch, Undo

# The dispatch key out-of-tree devices (torch_npu) register their kernels under.
DISPATCH_KEY = "PrivateUse1"
_libraries: List[Any] = []  # keep registrations alive for the life of the process
#: Qualified names of the ops given a host round trip in this process (shown by ``doctor``).
REGISTERED: List[str] = []
_calls: "collections.Counter[str]" = collections.Counter()
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class KernelLibrary:
    """An optional device-kernel library and whether it loaded (``error``: the import error, '' if it loaded)."""

    module: str
    error: str = ""


#: Optional op libraries tried in this process, by module name (shown by ``doctor``).
LIBRARIES: Dict[str, KernelLibrary] = {}


def import_kernel_libraries(profile: DeviceProfile) -> List[KernelLibrary]:
    """Import the profile's ``optional_op_modules``; a failure (an ABI mismatch is an ImportError naming an
    undefined symbol) is recorded in :data:`LIBRARIES` and warned about once, never raised.

    Example::

        import_kernel_libraries(backends.profile_for("npu"))   # [KernelLibrary('fbgemm_ascend', 'ImportError: ...')]
    """
    found = []
    for module in profile.optional_op_modules:
        if module not in LIBRARIES:
            try:
                importlib.import_module(module)
                LIBRARIES[module] = KernelLibrary(module)
            except Exception as err:  # an optional library may fail in any way its native code does
                LIBRARIES[module] = KernelLibrary(module, f"{type(err).__name__}: {err}")
                warnings.warn(
                    f"torchrec-ascend: {module} (device kernels for the {profile.name} backend) failed to load: "
                    f"{LIBRARIES[module].error}. Sparse ops run through the host fallback; embedding tables cannot "
                    f"be planned on {profile.device_type}. `torchrec-ascend doctor` lists each op.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        found.append(LIBRARIES[module])
    return found


def fallback_calls() -> Dict[str, int]:
    """Qualified op name -> number of calls that ran through the host fallback in this process."""
    with _lock:
        return dict(_calls)


def host_round_trip(op: Callable[..., Any], name: str = "") -> Callable[..., Any]:
    """Wrap ``op`` so it runs on the host: tensor arguments go to CPU, tensor results return to their device.

    The device is that of the first tensor argument (CPU if there is none). With ``name`` (the qualified op name),
    calls are counted (:func:`fallback_calls`) and the first one warns.

    Example::

        cumsum = host_round_trip(torch.ops.fbgemm.asynchronous_complete_cumsum.default)
        cumsum(lengths_on_npu)   # computed on the CPU, returned on the npu
    """
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    def run(*args: Any, **kwargs: Any) -> Any:
        if name:
            _count(name)
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
    import_kernel_libraries(profile)
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
            library.impl(name, host_round_trip(op, qualified), DISPATCH_KEY)
            done.append(qualified)
    _libraries.append(library)
    REGISTERED.extend(done)
    return done


def _count(name: str) -> None:
    with _lock:
        _calls[name] += 1
        first = _calls[name] == 1
    if first:
        warnings.warn(
            f"torchrec-ascend: {name} has no device kernel here and runs through the host fallback (inputs copied to "
            "the CPU and back: slow). Install a device-kernel library built for this torch (see `torchrec-ascend "
            "doctor`); calls are counted in torchrec_ascend.hooks.sparse_ops.fallback_calls().",
            RuntimeWarning,
            stacklevel=3,
        )


def _has_device_kernel(qualified: str) -> bool:
    """A kernel for the device's dispatch key, or its autograd key (TBE lookups are autograd functions)."""
    import torch

    try:
        return any(torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key)
                   for key in (DISPATCH_KEY, f"Autograd{DISPATCH_KEY}"))
    except RuntimeError:  # no such operator
        return False


def op_coverage(profile: DeviceProfile, namespace: str = "fbgemm") -> List[Tuple[str, str]]:
    """Per fbgemm op the device path calls: ``(qualified name, "device kernel" | "host fallback" | "no kernel")``.

    ``no kernel``: a ``device_tbe_ops`` entry with no device kernel (planning tables on the device is refused), or
    a fallback op not registered yet (the backend is not active).

    Example::

        op_coverage(backends.profile_for("npu"))   # [('fbgemm::block_bucketize_sparse_features', 'host fallback'), ...]
    """
    rows = []
    for name in (*profile.host_fallback_ops, *profile.device_tbe_ops):
        qualified = f"{namespace}::{name}"
        if qualified in REGISTERED:
            rows.append((qualified, "host fallback"))
        else:
            rows.append((qualified, "device kernel" if _has_device_kernel(qualified) else "no kernel"))
    return rows


def missing_device_tbe_ops(profile: DeviceProfile, namespace: str = "fbgemm") -> List[str]:
    """The profile's ``device_tbe_ops`` (qualified) that have no device kernel."""
    return [f"{namespace}::{n}" for n in profile.device_tbe_ops if not _has_device_kernel(f"{namespace}::{n}")]


def require_device_tbe(profile: DeviceProfile, sharding_type: str) -> None:
    """Refuse planning embedding tables on ``profile``'s device when its TBE ops have no device kernel.

    Raises:
        ConfigError: naming the missing ops, why the library that provides them did not load, and the choices.

    Example::

        require_device_tbe(backends.profile_for("npu"), "row_wise")   # raises without a loadable fbgemm-ascend
    """
    missing = missing_device_tbe_ops(profile)
    if not missing:
        return
    why = "; ".join(f"{lib.module}: {lib.error or 'loaded, but without these kernels'}"
                    for lib in (LIBRARIES.get(m) for m in profile.optional_op_modules) if lib) or "no library tried"
    raise ConfigError(
        f"cannot plan {sharding_type} embedding tables on {profile.device_type}: the device TBE needs "
        f"{', '.join(missing)}, without a {profile.device_type} kernel ({why}). Either install a device-kernel "
        f"library built for this torch and torch-npu ({', '.join(profile.optional_op_modules) or 'none declared'}; "
        f"fbgemm-ascend: build it from source, `pip install torchrec-ascend[npu-kernels]` once a matching release "
        f"exists), or plan these tables on the host (a Topology with compute_device='cpu', or "
        f"TORCHREC_ASCEND_DEVICE=cpu)."
    )


def host_fallback_patch(profile_of: Optional[Callable[[], DeviceProfile]] = None) -> Patch:
    """The registry entry registering host round trips for a backend's ``host_fallback_ops``.

    Args:
        profile_of: returns the backend whose ops are registered (default: the active one, activating it).

    Its target is the ``torch.ops.fbgemm`` namespace (always imported by then), so the registry applies it on its
    first pass; the undo drops the ``torch.library`` registrations this application made (and their names from
    :data:`REGISTERED`). No TorchRec source is involved: no version range, nothing to review for drift.

    Example::

        with PatchRegistry([host_fallback_patch()]):   # the active backend's missing ops go through the host
            ...
    """

    def apply_fn(patch: Patch) -> Undo:
        from torchrec_ascend import backends

        profile = profile_of() if profile_of is not None else backends.active()
        first_library = len(_libraries)
        done = register_host_fallbacks(profile)
        made = _libraries[first_library:]

        def undo() -> None:
            for library in made:
                _libraries.remove(library)  # the last reference: torch.library drops its registrations
            for name in done:
                REGISTERED.remove(name)
            made.clear()

        return undo

    return Patch(
        name="h6.host_fallback_ops",
        target="torch.ops:fbgemm",
        requires={},
        reason="fbgemm ops the device has no kernel for run on the host (inputs copied to the CPU and back)",
        apply_fn=apply_fn,
    )


#: Registry entries that change the op dispatcher rather than TorchRec source (applied before the patches).
REGISTRATIONS: List[Patch] = [host_fallback_patch()]

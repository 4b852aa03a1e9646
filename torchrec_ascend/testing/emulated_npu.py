"""The emulated NPU: device type ``npu`` on the host, so the accelerator path runs in CI. It is not hardware.

:func:`install` presents the device the way torch_npu does: PrivateUse1 renamed ``npu``, ``torch.npu`` (see
:mod:`torchrec_ascend.testing.device_module`), ``Tensor.npu()``/``is_npu``, pinned host memory, and the collective
backend ``"hccl"`` registered for ``devices=["npu"]`` (so ``init_process_group("cpu:gloo,npu:hccl")`` and the npu
profile's ``collective_backend`` work unchanged; the backend class is ``EmulatedHccl``, over gloo), and the
torchrec-ascend device backend ``npu_emulated`` (:mod:`torchrec_ascend.testing.backend`: the npu profile without
torch_npu to import; ``TORCHREC_ASCEND_DEVICE=npu_emulated``, or chosen automatically while torch_npu is absent).

Device memory is the emulator's own: an op mixing npu and CPU tensors fails as on hardware ("Expected all tensors
to be on the same device", 0-dim CPU scalars and CPU index tensors of indexing ops allowed, as torch allows them
for CUDA); reading device data on the host goes through a copy, and every such copy and host wait is counted:

* ``h2d`` / ``d2h`` (and ``*_bytes``): tensor copies host->device and device->host (``.to()``, ``.cpu()``,
  ``copy_``, ``.tolist()``); ``d2d``: device->device copies;
* ``syncs``: the host waited for the device: ``.item()``/``int(t)``/``bool(t)``/``float(t)`` (one each), a blocking
  device->host copy (``non_blocking=False``), ``torch.npu.synchronize()`` and stream/event ``synchronize()``, an op
  whose result is a number or truth value (``torch.equal``), and ops whose output size depends on the data
  (``nonzero``, ``unique``, ``masked_select``, boolean-mask indexing, ``bincount``).

fbgemm's ops get device kernels built over fbgemm's CPU kernels, standing in for fbgemm-ascend (TBE's training
lookups on the accelerator layout too: :mod:`torchrec_ascend.testing.tbe`);
:func:`withhold_ops` takes named ones away (they then have no npu kernel, as on SoCs where fbgemm-ascend lacks
them), so torchrec-ascend's host fallback (H6) registers its round trip for them. Operators of any other
namespace without a PrivateUse1 kernel fail on npu tensors, as a CPU-only op does on hardware.

Streams are checked, not run (:func:`install`'s ``stream_check``, on by default): after PyTorch's CUDA Stream
Sanitizer, every kernel records the device memory it reads and writes on the current stream, and events, waits
and synchronisations order the streams (vector clocks). An access to memory last written (or, for a write, read) on
another stream with nothing ordering the two raises a ``RuntimeError`` naming the op,
the tensor, both streams and both call sites; memory freed while another stream may still use it without
``record_stream`` raises at the next kernel; a host read of a pinned buffer whose ``non_blocking`` device->host copy
has not been waited for stops the process (the buffer is read-protected until a wait covers the copy) with the
checker's message and faulthandler's stack of the read. Every such message starts with :data:`STREAM_CHECK`.

Why a C++ PrivateUse1 backend (after PyTorch's own test backend, torch_openreg) rather than a tensor subclass:
tensors are plain ``torch.Tensor`` with a real device, dispatch key, allocator, storage, device guard and
streams, so ``type(t) is torch.Tensor``, ``data_ptr()``, ``nn.Parameter``, fbgemm's TBE modules, autograd,
``torch.distributed``'s per-device backend routing and the dispatcher's own "no kernel" check behave as with
torch_npu. A subclass would need every one of those faked in Python and would differ exactly where a
device-correctness test must not. Kernels run on the host over aliases of the device memory (no extra copies).

Example::

    from torchrec_ascend.testing import emulated_npu
    emulated_npu.install()
    x = torch.arange(4).to("npu")            # one h2d copy
    with emulated_npu.measure() as step:
        total = int((x * 2).sum())           # one sync
    assert step.counts.syncs == 1 and step.counts.h2d == 0
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import importlib.util
import os
import sys
import threading
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from torchrec_ascend.errors import BackendError

DEVICE_TYPE = "npu"
#: The collective backend name: the npu profile's ``collective_backend``, so scripts written for torch_npu run.
COLLECTIVE_BACKEND = "hccl"
#: Withheld unless :func:`install` is told otherwise: fbgemm-ascend lacks it on 910B.
WITHHELD_BY_DEFAULT: Tuple[str, ...] = ("block_bucketize_sparse_features",)
_NAMESPACE = "fbgemm"
#: How every stream-order error starts (the check's name in a failing run's output).
STREAM_CHECK = "stream-order check (emulated npu)"
#: Device memory per emulated device in bytes, where :func:`install` is not told (``--emulate`` runs); ``0``: unbounded.
MEMORY_ENV = "TORCHREC_ASCEND_EMULATOR_MEMORY"
#: ``0`` turns the stream-order checker off where :func:`install` is not told (``--emulate`` runs, to measure its cost).
STREAM_CHECK_ENV = "TORCHREC_ASCEND_EMULATOR_STREAM_CHECK"

_lock = threading.RLock()
_installed = False
_withheld: set = set()


@dataclasses.dataclass(frozen=True)
class Counts:
    """Copies between host and device memory and host waits (see the module docstring for what counts)."""

    h2d: int = 0
    h2d_bytes: int = 0
    d2h: int = 0
    d2h_bytes: int = 0
    d2d: int = 0
    syncs: int = 0

    def __sub__(self, other: "Counts") -> "Counts":
        return Counts(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


class Measurement:
    """The counts of a :func:`measure` block: live inside it, fixed once it exits."""

    def __init__(self) -> None:
        self._start = counters()
        self._threads_start = thread_counters()
        self._end: Optional[Counts] = None
        self._threads_end: Optional[Dict[int, Counts]] = None

    @property
    def counts(self) -> Counts:
        return (self._end if self._end is not None else counters()) - self._start

    @property
    def threads(self) -> Dict[int, Counts]:
        """Per native thread id, what each thread counted in the block (threads that counted nothing left out).

        A thread that exited inside the block leaves when its OS thread ends (its counts stay in :attr:`counts`);
        ``Thread.join()`` returns a moment before that, so it may still be here, named by its id only.
        """
        end = self._threads_end if self._threads_end is not None else thread_counters()
        spent = {tid: c - self._threads_start.get(tid, Counts()) for tid, c in end.items()}
        return {tid: c for tid, c in spent.items() if c != Counts()}

    def _close(self) -> None:
        self._end = counters()
        self._threads_end = thread_counters()


def _extension() -> Any:
    try:
        from torchrec_ascend.testing import _emulator
    except ImportError as err:
        raise BackendError(
            f"the emulated npu's native module torchrec_ascend.testing._emulator cannot be loaded ({err}); "
            "rebuild torchrec-ascend (pip install --no-build-isolation -e .)"
        ) from err
    return _emulator


def _refuse_real_stack() -> None:
    import torch

    name = torch._C._get_privateuse1_backend_name()
    if "torch_npu" in sys.modules or importlib.util.find_spec("torch_npu") is not None:
        raise BackendError(
            "torch_npu is installed: the emulated npu refuses to run next to the real Ascend stack (both would be "
            "PrivateUse1 'npu'); run the emulator in an environment without torch_npu, or test on the hardware"
        )
    if name != "privateuseone":
        raise BackendError(
            f"PrivateUse1 is already the {name!r} backend in this process; the emulated npu cannot be installed "
            "next to another out-of-tree device"
        )


def _create_collective_backend(store: Any, rank: int, size: int, timeout: Any) -> Any:
    import torch.distributed as dist

    host = dist.ProcessGroupGloo(store, rank, size, timeout)
    return _extension().EmulatedHccl(host, rank, size)


def _qualified(name: str) -> str:
    return name if "::" in name else f"{_NAMESPACE}::{name}"


def _overloads(name: str) -> List[str]:
    """Every registered overload of ``name`` (``ns::op`` and ``ns::op.overload``)."""
    import torch

    base = _qualified(name)
    return [n for n in torch._C._dispatch_get_all_op_names() if n == base or n.startswith(base + ".")]


def _import_fbgemm() -> bool:
    try:
        import fbgemm_gpu  # noqa: F401  (registers fbgemm's operators)
    except ImportError:
        return False
    return True


def _provide_fbgemm_ops() -> List[str]:
    import torch

    if not _import_fbgemm():
        return []
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    names = [
        n
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith(_NAMESPACE + "::")
        and n not in _withheld
        and has(n, "CPU")
        and not has(n, "PrivateUse1")
    ]
    _extension().provide_ops(names)
    from torchrec_ascend.testing import host_autograd, tbe

    tbe.register()
    host_autograd.register()
    return names


def install(device_count: int = 8, withhold: Iterable[str] = WITHHELD_BY_DEFAULT,
            stream_check: Optional[bool] = None, memory: Optional[int] = None) -> None:
    """Install the emulated NPU in this process (idempotent; call before building models on ``"npu"``).

    Args:
        device_count: emulated devices per process (``torch.npu.device_count()``); fixed by the first call.
        withhold: fbgemm op names (``"block_bucketize_sparse_features"`` or ``"fbgemm::..."``) given no npu
            kernel, as :func:`withhold_ops`; applied by every call. Call before the torchrec-ascend backend
            activates, so its host fallback (H6) sees them missing.
        stream_check: check stream order (module docstring); None: on unless ``TORCHREC_ASCEND_EMULATOR_STREAM_CHECK``
            is ``0``. Applied by every call; turning it on also enables :mod:`faulthandler` (the stack of a host
            read of an in-flight copy).
        memory: device memory per device in bytes (0: unbounded); None: ``TORCHREC_ASCEND_EMULATOR_MEMORY``, else
            the npu profile's HBM (64 GiB, a 910B's). An allocation past it raises ``torch.OutOfMemoryError``
            ("NPU out of memory. Tried to allocate ..."), as torch_npu's allocator does. Applied by every call.

    Raises:
        BackendError: torch_npu is installed, PrivateUse1 belongs to another backend, or the native module is
            not built.

    Example::

        emulated_npu.install()
        torch.ones(2, device="npu").is_npu   # True
    """
    global _installed
    import torch

    with _lock:
        if not _installed:
            _refuse_real_stack()
            ext = _extension()
            ext.set_device_count(int(device_count))
            torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
            torch.utils.generate_methods_for_privateuse1_backend(
                for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
            )
            from torchrec_ascend.testing import device_module

            torch._register_device_module(DEVICE_TYPE, device_module)
            import torch.distributed as dist

            if dist.is_available():
                dist.Backend.register_backend(COLLECTIVE_BACKEND, _create_collective_backend, devices=[DEVICE_TYPE])
            from torchrec_ascend.plugin_manager import get_plugin_manager
            from torchrec_ascend.testing import backend

            get_plugin_manager().register(backend, name=backend.NAME)
            _installed = True
        elif int(device_count) != int(_extension().device_count()):
            raise BackendError(
                f"the emulated npu is installed with {_extension().device_count()} devices; install() cannot "
                f"change it to {device_count} in the same process"
            )
        withhold = list(withhold)
        if withhold and not _import_fbgemm():
            raise BackendError(f"install(withhold={withhold}) needs fbgemm_gpu, which cannot be imported")
        withhold_ops(withhold)
        _provide_fbgemm_ops()
        set_stream_check(os.environ.get(STREAM_CHECK_ENV, "1") != "0" if stream_check is None else stream_check)
        _extension().set_memory_capacity(_capacity(memory))


def _capacity(memory: Optional[int]) -> int:
    if memory is None and os.environ.get(MEMORY_ENV):
        try:
            memory = int(os.environ[MEMORY_ENV])
        except ValueError:
            raise BackendError(f"{MEMORY_ENV}={os.environ[MEMORY_ENV]!r} is not a number of bytes") from None
    if memory is None:
        from torchrec_ascend.backends.npu import NPU

        memory = NPU.planner.hbm_cap_bytes or 0
    if memory < 0:
        raise BackendError(f"the emulated npu's memory must be >= 0 bytes (0: unbounded), got {memory}")
    return int(memory)


def memory_capacity() -> int:
    """Device memory per emulated device in bytes (0: unbounded); see :func:`install`."""
    return int(_extension().memory_capacity())


def set_stream_check(enabled: bool) -> None:
    """Turn the stream-order checker on or off in this process (memory allocated while off is not checked).

    Example::

        emulated_npu.set_stream_check(False)   # e.g. to time a run without it
    """
    import torch

    if enabled and not faulthandler.is_enabled():
        faulthandler.enable()  # before the checker's SIGSEGV handler, which hands a fault on to it
    _extension().set_stream_check(bool(enabled), os.path.dirname(torch.__file__) + os.sep)


def stream_check_enabled() -> bool:
    """Whether the stream-order checker is on."""
    return bool(_extension().stream_check_enabled())


def check_streams() -> None:
    """Raise the stream-order error found where none could be raised (memory freed in a deleter), if any.

    Raises:
        RuntimeError: memory was freed while another stream may still use it, without ``record_stream``.

    Example::

        del batch; emulated_npu.check_streams()   # at the end of a test, so a late free is not missed
    """
    _extension().raise_pending_stream_error()


def is_installed() -> bool:
    """Whether :func:`install` ran in this process."""
    return _installed


class Withheld:
    """Ops withheld by :func:`withhold_ops`; as a context manager, their kernels come back on exit."""

    def __init__(self, names: List[str]) -> None:
        self.names = names

    def restore(self) -> None:
        """Give the withheld ops their emulated kernels back (ops that gained another npu kernel keep it)."""
        import torch

        with _lock:
            _withheld.difference_update(self.names)
            back = [n for n in self.names if not torch._C._dispatch_has_kernel_for_dispatch_key(n, "PrivateUse1")]
            _extension().provide_ops(back)

    def __enter__(self) -> "Withheld":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()


def withhold_ops(names: Iterable[str]) -> Withheld:
    """Take the emulated npu kernels of fbgemm ops away (every overload), as on SoCs where fbgemm-ascend lacks them.

    A withheld op called on npu tensors raises ``NotImplementedError`` ("Could not run ... 'npu' backend"),
    unless another npu kernel is registered for it (torchrec-ascend's H6 host fallback, registered when the npu
    backend activates, for the ops the profile lists in ``host_fallback_ops``).

    Args:
        names: op names, ``"asynchronous_complete_cumsum"`` or ``"fbgemm::asynchronous_complete_cumsum"``.

    Returns:
        Withheld: the qualified names withheld; ``with withhold_ops([...]):`` restores them on exit.

    Raises:
        BackendError: a name matches no registered operator.

    Example::

        with emulated_npu.withhold_ops(["asynchronous_complete_cumsum"]):
            torch.ops.fbgemm.asynchronous_complete_cumsum(lengths_on_npu)   # NotImplementedError
    """
    with _lock:
        found: List[str] = []
        for name in names:
            overloads = _overloads(name)
            if not overloads:
                raise BackendError(
                    f"withhold_ops: no operator {_qualified(name)!r} is registered (import its library first, or "
                    "check the name)"
                )
            found += overloads
        if found:
            _withheld.update(found)
            _extension().withhold_ops(found)
        return Withheld(found)


def withheld_ops() -> List[str]:
    """Qualified names of the ops withheld now, sorted."""
    return sorted(_withheld)


def provided_ops() -> List[str]:
    """Qualified names of the non-aten ops the emulator gives an npu kernel now, sorted."""
    return sorted(_extension().provided_ops())


def counters() -> Counts:
    """The counts since the process started (all threads; per thread: :func:`thread_counters`).

    Example::

        before = emulated_npu.counters()
        x.cpu()
        (emulated_npu.counters() - before).d2h   # 1
    """
    return Counts(*(int(v) for v in _extension().counters()))


def thread_counters() -> Dict[int, Counts]:
    """The counts since each live thread started, by native thread id (``threading.get_native_id()``).

    Every count of :func:`counters` is also the calling thread's own, so a report can say where a copy or a host
    wait happened (:func:`thread_name` names the id). A thread's counts go when it exits.

    Example::

        emulated_npu.thread_counters()[threading.get_native_id()].syncs   # this thread's host waits so far
    """
    return {int(tid): Counts(*(int(v) for v in values)) for tid, values in _extension().thread_counters()}


def thread_name(native_id: int) -> str:
    """The Python name of the live thread with ``native_id``, or ``"native thread <id>"`` (a thread Python did not
    start, such as one of a collective backend's)."""
    for thread in threading.enumerate():
        if thread.native_id == native_id:
            return thread.name
    return f"native thread {native_id}"


@contextlib.contextmanager
def measure() -> Iterator[Measurement]:
    """Count the copies and host waits of a block (one training step, one kernel call).

    Example::

        with emulated_npu.measure() as step:
            loss = model(batch).sum(); loss.backward()
        assert step.counts.syncs == 0, step.counts
        assert step.threads.get(threading.get_native_id(), emulated_npu.Counts()).syncs == 0   # this thread's
    """
    measurement = Measurement()
    try:
        yield measurement
    finally:
        measurement._close()

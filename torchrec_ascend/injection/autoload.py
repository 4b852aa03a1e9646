"""The ``torch.backends`` entry point: arms the torchrec import hook, and records (never raises) any failure.

``import torch`` calls :func:`autoload` while torch itself is still importing, so this module imports nothing heavy
and touches nothing of torch: it only puts a :class:`TorchRecImportHook` on ``sys.meta_path``. The patch registry is
built, and the device backend activated, when the first ``torchrec`` module is imported.

Switches: ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (torch's own: no backend entry point runs) and
``TORCHREC_ASCEND_AUTOLOAD=0`` (ours: torchrec-ascend stays off). With either, :func:`activate` turns it on
explicitly. ``torchrec-ascend doctor`` shows the state recorded here.
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from typing import Optional

from torchrec_ascend.errors import TorchRecAscendError
from torchrec_ascend.injection import import_hook
from torchrec_ascend.injection.registry import PatchRegistry, fully_imported

OFF_SWITCH = "TORCHREC_ASCEND_AUTOLOAD"


@dataclasses.dataclass
class AutoloadStatus:
    """What happened to autoloading in this process (shown by ``doctor``).

    Attributes:
        state: ``not loaded`` (the entry point did not run), ``disabled`` (switched off), ``armed`` (waiting for
            the first torchrec import), ``active`` (registry built, patches applying) or ``error``.
        detail: one line: the switch that disabled it, or where and how it failed.
        errors: the full traceback of every recorded failure.
    """

    state: str = "not loaded"  # not loaded | disabled | armed | active | error
    detail: str = ""
    errors: list = dataclasses.field(default_factory=list)


STATUS = AutoloadStatus()
_registry: Optional[PatchRegistry] = None
_hook: Optional[import_hook.TorchRecImportHook] = None


def autoload() -> None:
    """Entry point called by ``import torch``. Never raises: a failure is recorded for ``doctor``."""
    try:
        if os.environ.get(OFF_SWITCH, "1") == "0":
            STATUS.state, STATUS.detail = "disabled", f"{OFF_SWITCH}=0"
            return
        _arm()
    except BaseException as err:  # noqa: B036 - `import torch` must survive anything we do
        if isinstance(err, KeyboardInterrupt):
            raise
        _record_error("autoload", err)


def activate() -> PatchRegistry:
    """Turn torchrec-ascend on explicitly (when autoloading is switched off) and patch loaded TorchRec modules.

    Modules TorchRec imports later are patched by the import hook, as with autoloading.

    Returns:
        PatchRegistry: the process's registry.

    Raises:
        TorchRecAscendError: the patch registry could not be built (the message carries the recorded error).
        BackendError: the selected device backend's stack fails to import.

    Example::

        import torchrec_ascend.injection.autoload as autoload
        registry = autoload.activate()
    """
    _arm()
    _on_first_import()
    if _registry is None:
        raise TorchRecAscendError(
            f"torchrec-ascend could not build its patch registry ({STATUS.detail}); run `torchrec-ascend doctor`"
        )
    _registry.apply(loaded_module="")
    return _registry


def deactivate() -> None:
    """Revert every applied patch, remove the import hook and forget the registry (``activate`` starts afresh)."""
    global _registry, _hook
    if _registry is not None:
        _registry.revert()
    if _hook is not None:
        import_hook.uninstall(_hook)
    _registry, _hook = None, None
    STATUS.state, STATUS.detail = "disabled", "deactivate() called"


def registry() -> Optional[PatchRegistry]:
    """The process's patch registry (None until the first torchrec import)."""
    return _registry


def _arm() -> None:
    global _hook
    if _hook is None:
        _hook = import_hook.TorchRecImportHook(_on_first_import, _watched, _on_loaded)
    import_hook.install(_hook)
    if _registry is None and STATUS.state != "error":
        STATUS.state, STATUS.detail = "armed", ""
    # torchrec was imported first (autoload off, or torchrec importing torch): patch what is already there. While
    # torchrec is still mid-import, the hook sees its remaining modules and does this on the next one.
    if fully_imported(import_hook.PREFIX):
        _on_first_import()
        if _registry is not None:
            _registry.apply(loaded_module="")


def _on_first_import() -> None:
    global _registry
    if _registry is not None:
        return
    try:
        from torchrec_ascend import backends, hooks
        from torchrec_ascend.injection import drift

        _registry = PatchRegistry([*hooks.registrations(), *hooks.default_patches()], reviewed=drift.reviewed_digests())
        STATUS.state = "active"
    except Exception as err:
        _record_error("building the patch registry", err)
        return
    # A broken accelerator stack must not silently fall back to CPU: this raises (from `import torchrec`).
    backends.activate()


def _watched() -> set:
    return _registry.watched_modules() if _registry is not None else set()


def _on_loaded(module: str) -> None:
    try:
        if _registry is not None:
            _registry.apply(loaded_module=module)
    except Exception as err:
        _record_error(f"patching {module}", err)


def _record_error(where: str, err: BaseException) -> None:
    STATUS.state = "error"
    STATUS.detail = f"{where}: {type(err).__name__}: {err}"
    STATUS.errors.append("".join(traceback.format_exception(type(err), err, err.__traceback__)))

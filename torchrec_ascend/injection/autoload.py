"""The ``torch.backends`` entry point: arms the torchrec import hook, and records (never raises) any failure.

``import torch`` calls :func:`autoload` while torch itself is still importing, so this module imports nothing heavy
and touches nothing of torch: it only puts a :class:`TorchRecImportHook` on ``sys.meta_path``. The patch registry is
built, and the device backend activated, when the first ``torchrec`` module is imported.

At its top level this module imports only the standard library and the stdlib-only import hook: torch turns an
exception raised while loading an entry point's module into a failed ``import torch``, and a missing or broken
dependency of ours (``packaging``, ``pluggy``, ...) must not do that. Everything else is imported inside the guards
below; a failure there is recorded and reported in one line naming the fix (``pip install packaging``).

Switches: ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (torch's own: no backend entry point runs) and
``TORCHREC_ASCEND_AUTOLOAD=0`` (ours: torchrec-ascend stays off). With either, :func:`activate` turns it on
explicitly. ``torchrec-ascend doctor`` shows the state recorded here.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback
import warnings
from typing import TYPE_CHECKING, Optional

from torchrec_ascend.injection import import_hook  # standard library only

if TYPE_CHECKING:
    from torchrec_ascend.injection.registry import PatchRegistry

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
    from torchrec_ascend.errors import TorchRecAscendError

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
        _hook = import_hook.TorchRecImportHook(_on_first_import, _watched, _on_loaded, _on_failed)
    import_hook.install(_hook)
    if _registry is None and STATUS.state != "error":
        STATUS.state, STATUS.detail = "armed", ""
    # torchrec was imported first (autoload off, or torchrec importing torch): patch what is already there. While
    # torchrec is still mid-import, the hook sees its remaining modules and does this on the next one.
    if _fully_imported(import_hook.PREFIX):
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
        from torchrec_ascend.injection.registry import PatchRegistry

        _registry = PatchRegistry([*hooks.registrations(), *hooks.default_patches()], reviewed=drift.reviewed_digests())
        STATUS.state = "active"
    except Exception as err:
        _record_error("building the patch registry", err)
        # stacklevel 3: the `import torchrec` (or `activate()`) line; warnings skips the importlib frames between.
        message = f"torchrec-ascend is off and TorchRec runs unmodified: {explain_failure(err)}"
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        return
    # A broken accelerator stack must not silently fall back to CPU: this raises (from `import torchrec`). Its own
    # import failures come back as BackendError; an ImportError here is a dependency of ours (pluggy, ...).
    try:
        backends.activate()
    except ImportError as err:
        message = f"torchrec-ascend could not choose a device backend: {explain_failure(err)}"
        raise ImportError(message, name=err.name) from err


def explain_failure(err: BaseException) -> str:
    """One line saying what failed and the command that fixes it: a dependency of ours that is missing, broken or
    too old is named with its requirement.

    Example::

        explain_failure(ModuleNotFoundError("No module named 'packaging'", name="packaging"))
        # -> 'torchrec-ascend needs packaging, which is not installed; fix: pip install "packaging>=23"'
    """
    name = (getattr(err, "name", None) or "") if isinstance(err, ImportError) else ""
    top = name.split(".")[0]
    requirement = _requirement(top) if top else None
    if requirement is None:
        return f"{type(err).__name__}: {err}; run `torchrec-ascend doctor` for details"
    if isinstance(err, ModuleNotFoundError) and name == top:
        return f'torchrec-ascend needs {top}, which is not installed; fix: pip install "{requirement}"'
    return (
        f"torchrec-ascend needs {top}, which fails to import ({type(err).__name__}: {err}); "
        f'fix: pip install --force-reinstall "{requirement}"'
    )


def _requirement(module: str) -> Optional[str]:
    """Our requirement on the distribution named like top-level ``module`` (``packaging>=23``), None if not one."""
    import importlib.metadata
    import re

    try:
        requirements = importlib.metadata.requires("torchrec-ascend") or []
    except Exception:  # not installed as a distribution, or broken metadata: nothing to name
        return None
    wanted = re.sub(r"[-_.]+", "-", module).lower()
    for requirement in requirements:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*([^;\[]*)", requirement)
        if match and ";" not in requirement and re.sub(r"[-_.]+", "-", match.group(1)).lower() == wanted:
            return (match.group(1) + match.group(2)).strip()
    return None


def _fully_imported(module: str) -> bool:
    """True if ``module`` finished executing (registry.fully_imported, repeated: arming must not need packaging)."""
    mod = sys.modules.get(module)
    return mod is not None and not getattr(getattr(mod, "__spec__", None), "_initializing", False)


def _watched() -> set:
    return _registry.watched_modules() if _registry is not None else set()


def _on_loaded(module: str) -> None:
    try:
        if _registry is not None:
            _registry.apply(loaded_module=module)
    except Exception as err:
        _record_error(f"patching {module}", err)


def _on_failed(module: str, err: BaseException) -> None:
    """``import torchrec`` failed: add what about the install caused it, and the fix, to the error (one line)."""
    if module != import_hook.PREFIX:
        return
    try:
        from torchrec_ascend.injection import install_problems

        line = install_problems.explain(err)
    except Exception:  # never replace the real error with ours
        return
    if line is None:
        return
    if hasattr(err, "add_note"):  # Python 3.11+: shown under the error's own message
        err.add_note(f"torchrec-ascend: {line}")
    else:
        warnings.warn(f"torchrec-ascend: {line}", RuntimeWarning, stacklevel=2)


def _record_error(where: str, err: BaseException) -> None:
    STATUS.state = "error"
    STATUS.detail = f"{where}: {type(err).__name__}: {err}"
    STATUS.errors.append("".join(traceback.format_exception(type(err), err, err.__traceback__)))

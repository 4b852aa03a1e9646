"""Device backends: the registered profiles, the active one, and how it is chosen.

Selection: ``TORCHREC_ASCEND_DEVICE`` names a backend (``cpu``, ``cuda``, ``npu``, or any plugin's); unset or
``auto`` picks the present backend with the highest priority. Activating imports the backend's modules
(``torch_npu``, ``fbgemm_ascend``); if that fails the error says why, and we fall back to CPU only when
``TORCHREC_ASCEND_ALLOW_FALLBACK=1`` asks for it.

The profiles are collected from the plugins once per plugin-manager state and cached: the planner hooks ask for
them on every sharder query.

Example::

    from torchrec_ascend import backends
    backends.active().name          # 'cpu' on this machine
    backends.profile_for("cpu").collective_backend   # 'gloo'
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import warnings
from typing import Dict, List, Optional, Tuple

from torchrec_ascend.backends.profile import (
    TORCHREC_REFERENCE_DEVICE,
    DeviceProfile,
    PlannerSpec,
    StreamSpec,
    TbeSpec,
)
from torchrec_ascend.errors import BackendError, PluginError

__all__ = [
    "DeviceProfile",
    "PlannerSpec",
    "StreamSpec",
    "TbeSpec",
    "TORCHREC_REFERENCE_DEVICE",
    "SelectionStatus",
    "activate",
    "active",
    "available_names",
    "profiles",
    "profile_for",
    "reset_for_tests",
    "selection_status",
]

DEVICE_ENV = "TORCHREC_ASCEND_DEVICE"
FALLBACK_ENV = "TORCHREC_ASCEND_ALLOW_FALLBACK"


@dataclasses.dataclass
class SelectionStatus:
    """How the active backend was chosen (shown by ``doctor``).

    Attributes:
        requested: the value of ``TORCHREC_ASCEND_DEVICE`` (``"auto"`` when unset).
        selected: the name of the active backend; empty until one is activated.
        detail: why the selection differs from the request, or why activation failed.
    """

    requested: str = "auto"
    selected: str = ""
    detail: str = ""


_STATUS = SelectionStatus()
_active: Optional[DeviceProfile] = None
# (plugin manager, its revision) -> profiles by name, and by device type
_cache: Optional[Tuple[object, int, Dict[str, DeviceProfile], Dict[str, DeviceProfile]]] = None


def _collect() -> Tuple[Dict[str, DeviceProfile], Dict[str, DeviceProfile]]:
    global _cache
    from torchrec_ascend.plugin_manager import get_plugin_manager

    manager = get_plugin_manager()
    if _cache is not None and _cache[0] is manager and _cache[1] == manager.revision:
        return _cache[2], _cache[3]
    found: Dict[str, DeviceProfile] = {}
    origin: Dict[str, str] = {}
    for profile, info in manager.collect("torchrec_ascend_device_backends"):
        if not isinstance(profile, DeviceProfile):
            raise PluginError(
                f"plugin {info.name!r} ({info.distribution}) returned {type(profile).__name__} from "
                f"torchrec_ascend_device_backends; it must return DeviceProfile objects"
            )
        if profile.name in found:
            raise BackendError(
                f"device backend {profile.name!r} is provided twice: by plugin {origin[profile.name]!r} and by "
                f"{info.name!r} ({info.distribution}); uninstall or block one of them"
            )
        found[profile.name], origin[profile.name] = profile, info.name
    by_device: Dict[str, DeviceProfile] = {}
    for profile in found.values():
        by_device.setdefault(profile.device_type, profile)
    _cache = (manager, manager.revision, found, by_device)
    return found, by_device


def profiles() -> Dict[str, DeviceProfile]:
    """Every registered backend profile by name (built-ins and plugins), in registration order.

    Returns:
        Dict[str, DeviceProfile]: a fresh dict; the profiles themselves are frozen.

    Raises:
        BackendError: two plugins provide a backend of the same name.
        PluginError: a plugin failed to load or raised in ``torchrec_ascend_device_backends``.

    Example::

        sorted(profiles())   # ['cpu', 'cuda', 'npu']
    """
    return dict(_collect()[0])


def profile_for(device_type: str) -> Optional[DeviceProfile]:
    """The profile for a ``torch.device`` type, or None if no backend declares it.

    Args:
        device_type: ``"cpu"``, ``"cuda"``, ``"npu"``... (the first registered profile of that type wins).

    Example::

        profile_for("npu").collective_backend   # 'hccl'
        profile_for("mtia")                     # None
    """
    return _collect()[1].get(device_type)


def _resolve(name: str, known: Dict[str, DeviceProfile]) -> DeviceProfile:
    if name in known:
        return known[name]
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise BackendError(
        f"{DEVICE_ENV}={name!r} is not a known device backend; valid names: auto, {', '.join(sorted(known))}.{hint}"
    )


def _select(requested: str, known: Dict[str, DeviceProfile]) -> DeviceProfile:
    if requested != "auto":
        return _resolve(requested, known)
    for profile in sorted(known.values(), key=lambda p: -p.priority):
        if profile.detect():
            return profile
    raise BackendError(
        f"no device backend reports its device as present (checked: {', '.join(sorted(known))}); set "
        f"{DEVICE_ENV} to one of them, or unblock the built-in backends (TORCHREC_ASCEND_BLOCK_PLUGINS)"
    )


def activate() -> DeviceProfile:
    """Choose the backend and import its modules (once per process; later calls return the same profile).

    Returns:
        DeviceProfile: the active backend.

    Raises:
        BackendError: ``TORCHREC_ASCEND_DEVICE`` names no backend (the message lists the valid names), or the
            selected backend's modules fail to import and ``TORCHREC_ASCEND_ALLOW_FALLBACK=1`` is not set (the
            message carries the underlying error).

    Example::

        profile = activate()   # imports torch_npu and fbgemm_ascend when the npu backend is selected
    """
    global _active
    if _active is not None:
        return _active
    known = profiles()
    requested = os.environ.get(DEVICE_ENV, "auto").strip().lower() or "auto"
    _STATUS.requested = requested
    profile = _select(requested, known)
    try:
        for module in profile.requires_modules + profile.op_modules:
            importlib.import_module(module)
    except Exception as err:
        message = (
            f"torchrec-ascend selected the {profile.name!r} backend but importing its stack failed: "
            f"{type(err).__name__}: {err}. Install/repair {profile.installed_with or profile.name}, or set "
            f"{DEVICE_ENV}=cpu to run on the CPU backend."
        )
        if os.environ.get(FALLBACK_ENV) != "1":
            _STATUS.detail = message
            raise BackendError(message + f" ({FALLBACK_ENV}=1 falls back to CPU with a warning.)") from err
        warnings.warn(message + f" Falling back to CPU as {FALLBACK_ENV}=1 asks.", RuntimeWarning, stacklevel=2)
        _STATUS.detail = f"fell back to cpu: {message}"
        profile = _resolve("cpu", known)
    _active = profile
    _STATUS.selected = profile.name
    return profile


def active() -> DeviceProfile:
    """The active backend profile (activating it on first use; see :func:`activate` for the errors).

    Example::

        active().device_type   # 'cpu' on this machine
    """
    return _active if _active is not None else activate()


def selection_status() -> SelectionStatus:
    """How the active backend was chosen (the object ``doctor`` prints)."""
    return _STATUS


def reset_for_tests() -> None:
    """Forget the active backend and the cached profiles so a test can select again.

    Host round trips for missing device ops are not the selection's: the patch registry's H6 entry registers them
    (for the backend active when it applies) and reverts them.
    """
    global _active, _cache
    _active = None
    _cache = None
    _STATUS.requested, _STATUS.selected, _STATUS.detail = "auto", "", ""


def available_names() -> List[str]:
    """The names ``TORCHREC_ASCEND_DEVICE`` accepts besides ``auto``, sorted."""
    return sorted(profiles())

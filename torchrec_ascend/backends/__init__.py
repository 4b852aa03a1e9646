"""Device backends: the registered profiles, the active one, and how it is chosen.

Selection: ``TORCHREC_ASCEND_DEVICE`` names a backend (``cpu``, ``cuda``, ``npu``, or any plugin's); unset or
``auto`` picks the present backend with the highest priority. Activating imports the backend's modules
(``torch_npu``, ``fbgemm_ascend``); if that fails the error says why, and we fall back to CPU only when
``TORCHREC_ASCEND_ALLOW_FALLBACK=1`` asks for it.

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
from typing import Dict, List, Optional

from torchrec_ascend.backends.profile import DeviceProfile, PlannerSpec, StreamSpec, TbeSpec
from torchrec_ascend.errors import BackendError

__all__ = [
    "DeviceProfile",
    "PlannerSpec",
    "StreamSpec",
    "TbeSpec",
    "SelectionStatus",
    "activate",
    "active",
    "profiles",
    "profile_for",
    "selection_status",
]

DEVICE_ENV = "TORCHREC_ASCEND_DEVICE"
FALLBACK_ENV = "TORCHREC_ASCEND_ALLOW_FALLBACK"


@dataclasses.dataclass
class SelectionStatus:
    """How the active backend was chosen (shown by ``doctor``)."""

    requested: str = "auto"
    selected: str = ""
    detail: str = ""


_STATUS = SelectionStatus()
_active: Optional[DeviceProfile] = None


def profiles() -> Dict[str, DeviceProfile]:
    """Every registered backend profile by name (built-ins and plugins)."""
    from torchrec_ascend.plugin_manager import get_plugin_manager

    found: Dict[str, DeviceProfile] = {}
    origin: Dict[str, str] = {}
    for profile, info in get_plugin_manager().collect("torchrec_ascend_device_backends"):
        if profile.name in found:
            raise BackendError(
                f"device backend {profile.name!r} is provided twice: by plugin {origin[profile.name]!r} and by "
                f"{info.name!r} ({info.distribution}); uninstall or block one of them"
            )
        found[profile.name], origin[profile.name] = profile, info.name
    return found


def profile_for(device_type: str) -> Optional[DeviceProfile]:
    """The profile for a ``torch.device`` type (``"cpu"``, ``"npu"``...), or None if no backend declares it."""
    for profile in profiles().values():
        if profile.device_type == device_type:
            return profile
    return None


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
    return known["cpu"]


def activate() -> DeviceProfile:
    """Choose the backend and import its modules (once). Raises :class:`BackendError` on a broken stack."""
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
        warnings.warn(message + " Falling back to CPU as requested.", RuntimeWarning, stacklevel=2)
        _STATUS.detail = f"fell back to cpu: {message}"
        profile = known["cpu"]
    from torchrec_ascend.hooks import sparse_ops

    sparse_ops.register_host_fallbacks(profile)
    _active = profile
    _STATUS.selected = profile.name
    return profile


def active() -> DeviceProfile:
    """The active backend profile (activating it on first use)."""
    return _active if _active is not None else activate()


def selection_status() -> SelectionStatus:
    return _STATUS


def reset_for_tests() -> None:
    """Forget the active backend so a test can select again."""
    global _active
    _active = None
    _STATUS.requested, _STATUS.selected, _STATUS.detail = "auto", "", ""


def available_names() -> List[str]:
    return sorted(profiles())

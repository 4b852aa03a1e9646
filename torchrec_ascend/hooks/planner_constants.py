"""H3: planner constants. Adds the lookup bandwidths of (device, kernel) pairs TorchRec has no figure for.

Without it the hardware-aware perf estimator raises "Unrecognized or unsupported compute kernel: key_value" when
planning key_value on CPU, or any kernel on npu. The figures come from the profiles' ``planner.kernel_bandwidths``.
A device planned under an alias (npu as cuda) reaches the estimator as the alias: the active backend's figures are
also registered under its alias, so an npu host plans with npu bandwidths, not cuda's.

Not covered: HBM/DDR storage rules, which follow the alias (cuda's) by design.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from torchrec_ascend import backends
from torchrec_ascend.injection.patch import Patch, Undo, resolve, set_attribute
from torchrec_ascend.versions import TORCHREC


def profile_bandwidths() -> Dict[Tuple[str, str], float]:
    """(device type, compute kernel) -> bytes/ms for every registered profile, plus the active one's alias.

    Example::

        profile_bandwidths()[("cpu", "key_value")]   # 2.7e7 (half of DDR bandwidth, in bytes/ms)
    """
    table: Dict[Tuple[str, str], float] = {}
    for profile in backends.profiles().values():
        for kernel, bandwidth in profile.planner.kernel_bandwidths.items():
            table[(profile.device_type, kernel)] = bandwidth
    current = backends.active()
    if current.planner.alias:
        for kernel, bandwidth in current.planner.kernel_bandwidths.items():
            table[(current.planner.alias, kernel)] = bandwidth
    return table


def _apply(patch: Patch) -> Undo:
    owner, attr = resolve(patch.target)
    stock: Dict[Tuple[str, str], float] = dict(owner.__dict__.get(attr, {}))
    merged: Dict[Tuple[str, str], Any] = {**profile_bandwidths(), **stock}  # TorchRec's own figures win
    return set_attribute(owner, attr, merged)


PATCHES = [
    Patch(
        name="h3.kernel_device_bandwidths",
        target="torchrec.distributed.planner.estimator.types:HardwarePerfConfig.kernel_device_bandwidths",
        requires=TORCHREC,
        reason="the perf estimator has no bandwidth for key_value on cpu nor for any kernel on npu",
        apply_fn=_apply,
    ),
]

"""The device backend profile of the emulated NPU, ``npu_emulated``, registered in-process by ``install()``.

It is the npu profile (every setting the hooks read: device type ``npu``, collective backend ``hccl``, TBE
placement, streams, planner constants, host fallback ops) without the real stack's modules to import, and named
so that ``doctor`` and the selection status say EMULATED. Select it with ``TORCHREC_ASCEND_DEVICE=npu_emulated``
(or automatically once the emulator is installed and torch_npu is absent: it ranks just below the real npu).

Example::

    emulated_npu.install()
    os.environ["TORCHREC_ASCEND_DEVICE"] = "npu_emulated"
    backends.activate().device_type   # 'npu'
"""

from __future__ import annotations

import dataclasses
from typing import List

from torchrec_ascend.backends.npu import NPU
from torchrec_ascend.backends.profile import DeviceProfile
from torchrec_ascend.hookspecs import hookimpl

#: The backend name ``TORCHREC_ASCEND_DEVICE`` accepts for the emulator.
NAME = "npu_emulated"


def _installed() -> bool:
    from torchrec_ascend.testing import emulated_npu

    return emulated_npu.is_installed()


EMULATED_NPU = dataclasses.replace(
    NPU,
    name=NAME,
    description="EMULATED npu (torchrec_ascend.testing, not hardware): host kernels, hccl-role backend over gloo",
    priority=NPU.priority - 1,
    detect=_installed,
    requires_modules=(),
    optional_op_modules=(),
    process_group_classes=(*NPU.process_group_classes, "torchrec_ascend.testing._emulator:EmulatedHccl"),
    installed_with="torchrec_ascend.testing.emulated_npu.install() (part of torchrec-ascend)",
)


@hookimpl
def torchrec_ascend_device_backends() -> List[DeviceProfile]:
    return [EMULATED_NPU]

"""The built-in device backends, registered through the ``torchrec_ascend`` entry-point group like any plugin."""

from __future__ import annotations

from typing import List

from torchrec_ascend.backends.cpu import CPU
from torchrec_ascend.backends.cuda import CUDA
from torchrec_ascend.backends.npu import NPU
from torchrec_ascend.backends.profile import DeviceProfile
from torchrec_ascend.hookspecs import hookimpl


@hookimpl
def torchrec_ascend_device_backends() -> List[DeviceProfile]:
    return [CPU, CUDA, NPU]

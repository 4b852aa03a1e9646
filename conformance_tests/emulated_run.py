"""Run a suite script on the emulated NPU: install ``torchrec_ascend.testing``'s emulator, then run the script.

The emulator must be installed before TorchRec is imported (the torchrec-ascend backend activates then and must
find the ``npu`` device), so the suite launches its scripts through this module under ``--emulate`` instead of
changing them: ``torchrun ... -m torchrec_ascend.conformance_tests.emulated_run SCRIPT ARGS...``. The script runs as
``__main__``, unchanged (the stock scripts still never import torchrec_ascend themselves).

The npu backend profile imports torch_npu when it activates; on the emulator the ranks activate
:data:`EMULATED_BACKEND` instead: the npu profile unchanged (device type, collectives, kernels, optimizers, TBE
placement, host fallbacks) except that the emulator, installed here, is its device stack.

Example::

    python -m torchrec_ascend.conformance_tests.emulated_run conformance_tests/injection/doctor_state.py
"""

from __future__ import annotations

import dataclasses
import os
import runpy
import sys
from typing import Any, List

#: The backend the ranks select on the emulator (``TORCHREC_ASCEND_DEVICE``).
EMULATED_BACKEND = "npu_emulated"


class _EmulatedBackend:
    """Plugin providing :data:`EMULATED_BACKEND`: the npu profile over the emulator instead of torch_npu."""

    from torchrec_ascend.hookspecs import hookimpl

    @hookimpl
    def torchrec_ascend_device_backends(self) -> List[Any]:
        from torchrec_ascend.backends.npu import NPU

        return [dataclasses.replace(
            NPU, name=EMULATED_BACKEND, description="EMULATED NPU (torchrec_ascend.testing), not Ascend hardware",
            detect=lambda: True, requires_modules=(), priority=NPU.priority - 1,
            installed_with="torchrec_ascend.testing.emulated_npu",
        )]


def main() -> None:
    from torchrec_ascend.backends import DEVICE_ENV
    from torchrec_ascend.plugin_manager import get_plugin_manager
    from torchrec_ascend.testing import emulated_npu

    emulated_npu.install()
    get_plugin_manager().register(_EmulatedBackend(), EMULATED_BACKEND)
    os.environ[DEVICE_ENV] = EMULATED_BACKEND
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

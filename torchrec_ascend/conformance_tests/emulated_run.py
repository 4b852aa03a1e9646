"""Run a suite script on the emulated NPU: install ``torchrec_ascend.testing``'s emulator, then run the script.

The emulator must be installed before TorchRec is imported (the torchrec-ascend backend activates then and must
find the ``npu`` device), so the suite launches its scripts through this module under ``--emulate`` instead of
changing them: ``torchrun ... -m torchrec_ascend.conformance_tests.emulated_run SCRIPT ARGS...``. The script runs as
``__main__``, unchanged (the stock scripts still never import torchrec_ascend themselves).

The npu backend profile imports torch_npu when it activates; on the emulator the ranks select the emulator's own
profile, :data:`EMULATED_BACKEND` (``torchrec_ascend.testing.backend``: the npu profile over the emulator).

Example::

    python -m torchrec_ascend.conformance_tests.emulated_run conformance_tests/injection/doctor_state.py
"""

from __future__ import annotations

import os
import runpy
import sys

from torchrec_ascend.testing.backend import NAME as EMULATED_BACKEND


def main() -> None:
    from torchrec_ascend.backends import DEVICE_ENV
    from torchrec_ascend.testing import emulated_npu

    emulated_npu.install()  # also registers the emulator's backend profile
    os.environ[DEVICE_ENV] = EMULATED_BACKEND
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT` does: its siblings import
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

"""The emulator tests run their programs (tests/emulator/emulator_probe.py) in fresh interpreters via
tests/foundation/fresh_interpreter.py: installing the emulated NPU renames PrivateUse1 for the whole process."""

import sys
from pathlib import Path

_FOUNDATION = str(Path(__file__).resolve().parents[1] / "foundation")
if _FOUNDATION not in sys.path:
    sys.path.insert(0, _FOUNDATION)

"""Check: checkpoints of hash and KEY_VALUE tables round-trip and reshard (``plugin/checkpoint.py``).

The checkpoint script owns its cases and its verdict; the suite asks it through two module functions:
``conformance_cases(world_size: int, quick: bool) -> List[dict]`` (the JSON cases to launch it with) and
``check_result(result: dict) -> None`` (raises ``AssertionError`` saying what differs). Until the script is part of
the install, or defines both, the check is skipped with that reason.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, List

from torchrec_ascend.conformance_tests.cases import Case
from torchrec_ascend.conformance_tests.config import SuiteConfig
from torchrec_ascend.conformance_tests.harness import result_of, script_check

SCRIPT = Path(__file__).parent / "plugin" / "checkpoint.py"
MODULE = "torchrec_ascend.conformance_tests.plugin.checkpoint"
PROTOCOL = ("conformance_cases", "check_result")


def script_module() -> Any:
    """The checkpoint script as a module, or None when it is not installed or lacks :data:`PROTOCOL`."""
    if not SCRIPT.exists():
        return None
    module = importlib.import_module(MODULE)
    return module if all(hasattr(module, name) for name in PROTOCOL) else None


def cases_of(suite: SuiteConfig) -> List[Case]:
    """The checkpoint script's own cases, or one skipped case saying why there are none."""
    module = script_module()
    if module is None:
        what = f"does not define {' and '.join(PROTOCOL)}" if SCRIPT.exists() else "is not part of this install yet"
        why = f"conformance_tests/plugin/checkpoint.py {what}"
        return [Case({"checkpoint": "round_trip_and_resharding"}, skip=why)]
    return [Case(dict(params)) for params in module.conformance_cases(suite.world_size, suite.quick)]


pytest_generate_tests, run = script_check(SCRIPT, cases_of)


def test_case(case: Case, request: Any) -> None:
    result = result_of(request, "run", case)
    script_module().check_result(result)

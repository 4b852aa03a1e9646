"""Check: KEY_VALUE (a tiny device cache over host memory over disk) trains bit for bit like FUSED.

Runs ``plugin/key_value.py``: the same hash-table model twice, once FUSED (every row in the TBE) and once KEY_VALUE
with 64 cache rows per shard and 8 KiB of host memory; every step's output and every final row must be exactly
equal, and the cache must really have swapped (the long case must also have spilled rows to disk).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

from torchrec_ascend.conformance_tests.cases import Case, key_value_cases
from torchrec_ascend.conformance_tests.config import SuiteConfig
from torchrec_ascend.conformance_tests.harness import result_of, script_check

SCRIPT = Path(__file__).parent / "plugin" / "key_value.py"


def cases_of(suite: SuiteConfig) -> List[Case]:
    """The check's cases on the suite's device (see ``cases.key_value_cases``)."""
    return key_value_cases(suite.profile, suite.world_size, suite.quick)


pytest_generate_tests, run = script_check(SCRIPT, cases_of)


def test_case(case: Case, request: Any) -> None:
    r = result_of(request, "run", case)
    assert r["fwd_err"] == 0.0, f"KEY_VALUE forward differs from FUSED by {r['fwd_err']}: not bit for bit"
    assert r["row_err"] == 0.0, f"KEY_VALUE final rows differ from FUSED by {r['row_err']}: not bit for bit"
    assert r["evicted"] > 0 and r["swapped_in"] > 0, "the cache never swapped: the case proves nothing"
    if case.expect.get("disk_rows"):
        assert r["disk_rows"] > 0, "the host budget should have spilled rows to disk"

"""Check: KEY_VALUE (a tiny device cache over host memory over disk) trains bit for bit like FUSED.

Runs ``plugin/key_value.py``: the same hash-table model twice, once FUSED (every row in the TBE) and once KEY_VALUE
with 64 cache rows per shard and 8 KiB of host memory; every step's output and every final row must be exactly
equal, and the cache must really have swapped (the long case must also have spilled rows to disk). The pin-release
cases (launched on one rank) run the KEY_VALUE copy behind ``HybridTrainPipelineSparseDist`` at several depths with
a cache barely larger than one batch's rows, for 200 batches, against FUSED in a plain loop: every batch must train
(the rows a batch pins are released after its backward) and the result must still be bit for bit. The compute-budget
cases run KEY_VALUE, then FUSED hash tables, behind the pipeline on every rank (FUSED: every batch's IDs mapped on a
lane, bit for bit with the plain loop).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import pytest

from torchrec_ascend.conformance_tests.cases import Case, key_value_cases
from torchrec_ascend.conformance_tests.config import ScriptRun, SuiteConfig
from torchrec_ascend.conformance_tests.harness import launch, parametrize, result_of

SCRIPT = Path(__file__).parent / "plugin" / "key_value.py"


def cases_of(suite: SuiteConfig) -> List[Case]:
    """The check's cases on the suite's device (see ``cases.key_value_cases``)."""
    return key_value_cases(suite.profile, suite.world_size, suite.quick)


def pytest_generate_tests(metafunc: Any) -> None:
    parametrize(metafunc, cases_of)


@pytest.fixture(scope="module")
def run(suite: SuiteConfig) -> ScriptRun:
    """One launch on the suite's ranks for every case but the one-rank ones."""
    return launch(suite, SCRIPT, [c for c in cases_of(suite) if c.expect.get("ranks") != 1])


@pytest.fixture(scope="module")
def run_one_rank(suite: SuiteConfig) -> ScriptRun:
    """One launch on one rank for the pin-release cases (``expect["ranks"] == 1``)."""
    return launch(suite, SCRIPT, [c for c in cases_of(suite) if c.expect.get("ranks") == 1], world_size=1)


def test_case(case: Case, request: Any) -> None:
    r = result_of(request, "run_one_rank" if case.expect.get("ranks") == 1 else "run", case)
    assert r["fwd_err"] == 0.0, f"KEY_VALUE forward differs from FUSED by {r['fwd_err']}: not bit for bit"
    assert r["row_err"] == 0.0, f"KEY_VALUE final rows differ from FUSED by {r['row_err']}: not bit for bit"
    if case.expect.get("prefetched"):  # FUSED behind the pipeline: every lookup found its rows mapped on a lane
        assert (r["trained"], r["prefetched"]) == (case.expect["trained"], r["kernels"] * r["trained"]), (
            f"FUSED behind the pipeline: {r['prefetched']} of {r['kernels']} kernels x {r['trained']} batches were "
            "prefetched")
        return
    if case.expect.get("whole_table"):  # load_factor=1.0 holds the whole shard
        assert r["evicted"] == 0 and r["disk_rows"] == 0, (
            f"a cache of the whole shard evicted {r['evicted']} rows ({r['disk_rows']} on disk)")
        return
    assert r["evicted"] > 0 and r["swapped_in"] > 0, "the cache never swapped: the case proves nothing"
    if "trained" in case.expect:  # behind the pipeline, with a cache barely larger than one batch
        assert r["trained"] == case.expect["trained"], (
            f"the pipeline trained {r['trained']} of {case.expect['trained']} batches: pinned rows were not released"
        )
    if case.expect.get("disk_rows"):
        assert r["disk_rows"] > 0, "the host budget should have spilled rows to disk"

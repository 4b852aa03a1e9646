"""The summary table counts each case once, by its worst phase, and charges every phase's time to its check.

Oracle: hand-counted outcomes of a small synthetic run (a passing, a failing, a skipped case, and a module fixture
whose launch failed in setup).
"""

from __future__ import annotations

from torchrec_ascend.conformance_tests.summary import check_of, format_table, record, summarize


def test_check_of_module_file() -> None:
    assert check_of("/site/torchrec_ascend/conformance_tests/test_hash_tables.py") == "hash_tables"
    assert check_of("test_sharding.py") == "sharding"


def synthetic_run() -> dict:
    outcomes: dict = {}
    phases = [
        ("s::a", "sharding", "setup", "passed", 10.0, ""),  # the launch is in the first case's setup
        ("s::a", "sharding", "call", "passed", 0.5, ""),
        ("s::a", "sharding", "teardown", "passed", 0.0, ""),
        ("s::b", "sharding", "call", "failed", 0.25, ""),
        ("s::b", "sharding", "teardown", "passed", 0.25, ""),
        ("s::c", "sharding", "setup", "skipped", 0.0, "ADAM is not supported on cpu"),
        ("s::d", "sharding", "setup", "skipped", 0.0, "ADAM is not supported on cpu"),
        ("e::x", "errors", "setup", "failed", 3.0, ""),  # the launch crashed: its case fails
        ("e::x", "errors", "teardown", "skipped", 0.0, "never reached"),  # a failure wins over a later skip
    ]
    for phase in phases:
        record(outcomes, *phase)
    return outcomes


def test_counts_outcomes_and_seconds_per_check() -> None:
    rows = {r.check: r for r in summarize(synthetic_run())}
    sharding, errors = rows["sharding"], rows["errors"]
    assert (sharding.cases, sharding.passed, sharding.failed, sharding.skipped) == (4, 1, 1, 2)
    assert sharding.seconds == 11.0
    assert sharding.reasons == {"ADAM is not supported on cpu": 2}
    assert (errors.cases, errors.passed, errors.failed, errors.skipped) == (1, 0, 1, 0)


def test_table_lists_checks_total_and_reasons() -> None:
    text = format_table(summarize(synthetic_run()), title="run")
    lines = text.splitlines()
    assert lines[0] == "run"
    assert lines[1].split() == ["check", "cases", "passed", "failed", "skipped", "seconds"]
    assert lines[2].split() == ["sharding", "4", "1", "1", "2", "11.0"]
    assert lines[3].split() == ["errors", "1", "0", "1", "0", "3.0"]
    assert lines[4].split() == ["total", "5", "1", "2", "2", "14.0"]
    assert lines[5:] == ["skipped:", "  sharding: ADAM is not supported on cpu (2)"]

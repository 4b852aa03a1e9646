"""The summary table counts each case once, by its worst phase, and charges every phase's time to its check.

Oracle: hand-counted outcomes of a small synthetic run (a passing, a failing, a skipped case, and a module fixture
whose launch failed in setup); the device types and per-kernel copy counts its cases reported, added up by hand.
"""

from __future__ import annotations

from torchrec_ascend.conformance_tests.summary import (
    check_of,
    format_table,
    format_transfers,
    record,
    summarize,
    transfer_rows,
)

ON_NPU = {"parameters": ["npu"], "optimizer": [], "outputs": ["npu"]}


def test_check_of_module_file() -> None:
    assert check_of("/site/torchrec_ascend/conformance_tests/test_hash_tables.py") == "hash_tables"
    assert check_of("test_sharding.py") == "sharding"


def synthetic_run() -> dict:
    outcomes: dict = {}
    phases = [
        ("s::a", "sharding", "setup", "passed", 10.0, ""),  # the launch is in the first case's setup
        ("s::a", "sharding", "call", "passed", 0.5, "", ON_NPU, {"fused_hash": {"steps": 4, "h2d": 8, "d2h": 4,
                                                                                  "syncs": 4}}),
        ("s::a", "sharding", "teardown", "passed", 0.0, ""),
        ("s::b", "sharding", "call", "failed", 0.25, "", {"parameters": ["cpu"], "outputs": ["npu"]},
         {"fused_hash": {"steps": 4, "h2d": 4, "d2h": 4, "syncs": 0}, "key_value": {"steps": 2, "h2d": 6}}),
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
    assert sharding.devices == {"cpu", "npu"} and errors.devices == set()


def test_transfers_add_up_per_kernel_and_print_per_step() -> None:
    totals = transfer_rows(synthetic_run())
    assert totals == {"fused_hash": {"steps": 8, "h2d": 12, "d2h": 8, "syncs": 4}, "key_value": {"steps": 2, "h2d": 6}}
    lines = format_transfers(totals).splitlines()
    assert lines[0].split() == ["kernel", "steps", "H2D/step", "D2H/step", "syncs/step"]
    assert lines[1].split() == ["fused_hash", "8", "1.50", "1.00", "0.50"]
    assert lines[2].split() == ["key_value", "2", "3.00", "0.00", "0.00"]
    assert format_transfers({}) == ""


def test_table_lists_checks_total_and_reasons() -> None:
    text = format_table(summarize(synthetic_run()), title="run")
    lines = text.splitlines()
    assert lines[0] == "run"
    assert lines[1].split() == ["check", "cases", "passed", "failed", "skipped", "seconds", "ran", "on"]
    assert lines[2].split() == ["sharding", "4", "1", "1", "2", "11.0", "cpu,npu"]
    assert lines[3].split() == ["errors", "1", "0", "1", "0", "3.0", "-"]
    assert lines[4].split() == ["total", "5", "1", "2", "2", "14.0", "cpu,npu"]
    assert lines[5:] == ["skipped:", "  sharding: ADAM is not supported on cpu (2)"]

"""The table printed at the end of a conformance run: per check, cases, passed, failed, skipped (why), seconds.

A check is one ``test_<check>.py`` module of the suite; a case is one test in it. Outcomes are collected from
pytest's per-phase reports (:func:`record`), so a failing module fixture (a launch that crashed) counts as failed
cases of its check, and its time is charged to that check.

Example::

    outcomes = {}
    record(outcomes, "test_sharding.py::test_case[ebc-row_wise-sgd]", "sharding", "call", "passed", 1.5, "")
    print(format_table(summarize(outcomes)))
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Dict, List

OUTCOMES = ("passed", "failed", "skipped")


@dataclasses.dataclass
class CaseOutcome:
    """One case over its setup, call and teardown phases.

    Attributes:
        check (str): the check the case belongs to (``sharding`` for ``test_sharding.py``).
        outcome (str): ``passed``, ``failed`` or ``skipped``; a failure in any phase wins.
        seconds (float): time spent in all phases (a module fixture's launch is in its first case's setup).
        reason (str): why it was skipped.
    """

    check: str
    outcome: str = "passed"
    seconds: float = 0.0
    reason: str = ""


@dataclasses.dataclass
class CheckRow:
    """One line of the summary table (see :func:`summarize`)."""

    check: str
    cases: int
    passed: int
    failed: int
    skipped: int
    seconds: float
    reasons: Dict[str, int]


def check_of(module_file: str) -> str:
    """The check a test module holds: ``.../test_sharding.py`` -> ``sharding``."""
    stem = module_file.rsplit("/", 1)[-1].removesuffix(".py")
    return stem.removeprefix("test_")


def record(outcomes: Dict[str, CaseOutcome], nodeid: str, check: str, when: str, outcome: str, seconds: float,
           reason: str) -> None:
    """Fold one phase report into ``outcomes`` (keyed by node id).

    Args:
        outcomes: the run's outcomes so far, updated in place.
        nodeid: the test's node id.
        check: the check the test belongs to (see :func:`check_of`).
        when: ``setup``, ``call`` or ``teardown``.
        outcome: the phase's ``passed``, ``failed`` or ``skipped``.
        seconds: the phase's duration.
        reason: the skip reason, when skipped.
    """
    case = outcomes.setdefault(nodeid, CaseOutcome(check))
    case.seconds += seconds
    if outcome == "failed":
        case.outcome = "failed"
    elif outcome == "skipped" and case.outcome != "failed":
        case.outcome, case.reason = "skipped", reason


def summarize(outcomes: Dict[str, CaseOutcome]) -> List[CheckRow]:
    """One row per check, in the order the checks ran."""
    rows: Dict[str, CheckRow] = {}
    for case in outcomes.values():
        row = rows.setdefault(case.check, CheckRow(case.check, 0, 0, 0, 0, 0.0, {}))
        row.cases += 1
        setattr(row, case.outcome, getattr(row, case.outcome) + 1)
        row.seconds += case.seconds
        if case.outcome == "skipped":
            row.reasons = dict(Counter(row.reasons) + Counter({case.reason: 1}))
    return list(rows.values())


def format_table(rows: List[CheckRow], title: str = "") -> str:
    """The summary as aligned text: a table, a total line, then every skip reason with its count.

    Example::

        check        cases  passed  failed  skipped  seconds
        sharding        36      35       0        1     48.2
        total           36      35       0        1     48.2
        skipped:
          sharding: EMAINPLACE_ROWWISE_ADAGRAD ... (1)
    """
    header = ("check", "cases", "passed", "failed", "skipped", "seconds")
    total = CheckRow("total", *(sum(getattr(r, f) for r in rows) for f in ("cases", "passed", "failed", "skipped")),
                     sum(r.seconds for r in rows), {})
    lines = [[r.check, r.cases, r.passed, r.failed, r.skipped, f"{r.seconds:.1f}"] for r in [*rows, total]]
    width = max(len(header[0]), *(len(str(line[0])) for line in lines))
    fmt = lambda cells: f"{cells[0]:<{width}}" + "".join(f"  {c:>7}" for c in cells[1:])  # noqa: E731
    out = ([title] if title else []) + [fmt(header)] + [fmt(line) for line in lines]
    reasons = [f"  {r.check}: {reason} ({n})" for r in rows for reason, n in r.reasons.items()]
    return "\n".join(out + (["skipped:"] + reasons if reasons else []))

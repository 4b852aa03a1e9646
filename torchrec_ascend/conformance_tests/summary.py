"""The table printed at the end of a conformance run: per check, cases, passed, failed, skipped (why), seconds, and
where the cases' tensors lived; then the host<->device copies and host syncs per training step, by kernel.

A check is one ``test_<check>.py`` module of the suite; a case is one test in it. Outcomes are collected from
pytest's per-phase reports (:func:`record`), so a failing module fixture (a launch that crashed) counts as failed
cases of its check, and its time is charged to that check. A case's ``residency`` (the device types its parameters,
optimizer state, inputs and outputs lived on) and ``transfers`` (per kernel: training steps counted, host-to-device
and device-to-host copies, host syncs) come from its report's user properties (``harness.result_of``).

Example::

    outcomes = {}
    record(outcomes, "test_sharding.py::test_case[ebc-row_wise-sgd]", "sharding", "call", "passed", 1.5, "",
           residency={"parameters": ["cpu"], "outputs": ["cpu"]})
    print(format_table(summarize(outcomes)))
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Dict, List, Optional, Set

OUTCOMES = ("passed", "failed", "skipped")


@dataclasses.dataclass
class CaseOutcome:
    """One case over its setup, call and teardown phases.

    Attributes:
        check (str): the check the case belongs to (``sharding`` for ``test_sharding.py``).
        outcome (str): ``passed``, ``failed`` or ``skipped``; a failure in any phase wins.
        seconds (float): time spent in all phases (a module fixture's launch is in its first case's setup).
        reason (str): why it was skipped.
        devices (Set[str]): the device types its tensors lived on (empty: it trained nothing or was not reached).
        transfers (Dict[str, Dict[str, int]]): kernel -> ``steps``, ``h2d``, ``d2h``, ``syncs`` counted.
    """

    check: str
    outcome: str = "passed"
    seconds: float = 0.0
    reason: str = ""
    devices: Set[str] = dataclasses.field(default_factory=set)
    transfers: Dict[str, Dict[str, int]] = dataclasses.field(default_factory=dict)


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
    devices: Set[str] = dataclasses.field(default_factory=set)


def check_of(module_file: str) -> str:
    """The check a test module holds: ``.../test_sharding.py`` -> ``sharding``."""
    stem = module_file.rsplit("/", 1)[-1].removesuffix(".py")
    return stem.removeprefix("test_")


def record(outcomes: Dict[str, CaseOutcome], nodeid: str, check: str, when: str, outcome: str, seconds: float,
           reason: str, residency: Optional[Dict[str, List[str]]] = None,
           transfers: Optional[Dict[str, Dict[str, int]]] = None) -> None:
    """Fold one phase report into ``outcomes`` (keyed by node id).

    Args:
        outcomes: the run's outcomes so far, updated in place.
        nodeid: the test's node id.
        check: the check the test belongs to (see :func:`check_of`).
        when: ``setup``, ``call`` or ``teardown``.
        outcome: the phase's ``passed``, ``failed`` or ``skipped``.
        seconds: the phase's duration.
        reason: the skip reason, when skipped.
        residency: part -> device types, when the case reported where it trained.
        transfers: kernel -> copy and sync counts, when the case counted them.
    """
    case = outcomes.setdefault(nodeid, CaseOutcome(check))
    case.seconds += seconds
    case.devices.update(*(residency or {}).values())
    case.transfers.update(transfers or {})
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
        row.devices |= case.devices
        if case.outcome == "skipped":
            row.reasons = dict(Counter(row.reasons) + Counter({case.reason: 1}))
    return list(rows.values())


def format_table(rows: List[CheckRow], title: str = "") -> str:
    """The summary as aligned text: a table, a total line, then every skip reason with its count. ``ran on`` lists
    the device types the check's cases trained on (``-``: none reported, e.g. checks that train nothing).

    Example::

        check        cases  passed  failed  skipped  seconds  ran on
        sharding        36      35       0        1     48.2  npu
        total           36      35       0        1     48.2  npu
        skipped:
          sharding: EMAINPLACE_ROWWISE_ADAGRAD ... (1)
    """
    header = ("check", "cases", "passed", "failed", "skipped", "seconds", "ran on")
    counts = ("cases", "passed", "failed", "skipped")
    cases, passed, failed, skipped = (sum(getattr(r, f) for r in rows) for f in counts)
    total = CheckRow("total", cases, passed, failed, skipped, sum(r.seconds for r in rows), {},
                     set().union(*(r.devices for r in rows)))
    lines = [[r.check, r.cases, r.passed, r.failed, r.skipped, f"{r.seconds:.1f}", ",".join(sorted(r.devices)) or "-"]
             for r in [*rows, total]]
    width = max(len(header[0]), *(len(str(line[0])) for line in lines))
    fmt = lambda cells: (f"{cells[0]:<{width}}" + "".join(f"  {c:>7}" for c in cells[1:-1])
                         + f"  {cells[-1]}")
    out = ([title] if title else []) + [fmt(header)] + [fmt(line) for line in lines]
    reasons = [f"  {r.check}: {reason} ({n})" for r in rows for reason, n in r.reasons.items()]
    return "\n".join(out + (["skipped:"] + reasons if reasons else []))


def transfer_rows(outcomes: Dict[str, CaseOutcome]) -> Dict[str, Dict[str, int]]:
    """Kernel -> the counts over every case that reported them, summed (``steps``, ``h2d``, ``d2h``, ``syncs``)."""
    totals: Dict[str, Dict[str, int]] = {}
    for case in outcomes.values():
        for kernel, counts in case.transfers.items():
            row = totals.setdefault(kernel, {})
            for key, value in counts.items():
                row[key] = row.get(key, 0) + value
    return totals


def format_transfers(totals: Dict[str, Dict[str, Any]]) -> str:
    """Per kernel, the host-to-device and device-to-host copies and host syncs per training step, as text.

    Example::

        kernel           steps  H2D/step  D2H/step  syncs/step
        fused_hash          16      2.00      1.00        1.00
    """
    if not totals:
        return ""
    header = ("kernel", "steps", "H2D/step", "D2H/step", "syncs/step")
    width = max(len(header[0]), *(len(k) for k in totals))
    lines = [f"{header[0]:<{width}}" + "".join(f"  {h:>10}" for h in header[1:])]
    for kernel, row in totals.items():
        steps = max(row.get("steps", 0), 1)
        cells = [row.get("steps", 0)] + [f"{row.get(k, 0) / steps:.2f}" for k in ("h2d", "d2h", "syncs")]
        lines.append(f"{kernel:<{width}}" + "".join(f"  {c:>10}" for c in cells))
    return "\n".join(lines)

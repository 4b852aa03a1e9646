"""The suite's pytest plugin: its options, the ``suite`` fixture and the summary table at the end.

``torchrec-ascend conformance`` runs ``pytest -p torchrec_ascend.conformance_tests.pytest_plugin --pyargs
torchrec_ascend.conformance_tests`` with the options below, so both ways of running the suite collect and run the
same checks::

    pytest -p torchrec_ascend.conformance_tests.pytest_plugin --pyargs torchrec_ascend.conformance_tests \\
        --conformance-device cpu --conformance-quick

Without ``-p`` the suite's ``conftest.py`` loads this plugin while collecting, too late for options: the run uses
the defaults (cpu, 2 ranks, every installed policy, full). The plugin is inert in sessions that collect no
conformance check: the table only counts tests of this package.

``--conformance-case ID`` (the CLI's ``--case``) keeps only the suite's tests of that parameter id, such as a failed
case to run again; an id no collected test carries is refused, naming the ids there are.

A run that checked nothing exits non-zero (:data:`NOTHING_CHECKED`) saying so: every case skipped, or the device
under test is absent, so the checks that train on it skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from torchrec_ascend.conformance_tests.config import CHECKS, SuiteConfig, add_options
from torchrec_ascend.conformance_tests.summary import (
    CaseOutcome,
    check_of,
    format_table,
    format_transfers,
    record,
    summarize,
    transfer_rows,
)

PACKAGE_DIR = Path(__file__).parent
#: Exit status of a run that checked nothing on its device (pytest's own codes are 0-5).
NOTHING_CHECKED = 6


class _Summary:
    """Collects the phase reports of the suite's tests and prints the per-check table at the end of the run."""

    def __init__(self) -> None:
        self.checks: Dict[str, str] = {}  # node id -> check, for the suite's tests only
        self.outcomes: Dict[str, CaseOutcome] = {}

    def pytest_collection_modifyitems(self, items: Any) -> None:
        self.checks = {i.nodeid: check_of(str(i.path)) for i in items if PACKAGE_DIR in Path(str(i.path)).parents}
        # Checks run in CHECKS order (the cheap injection check first), each module's cases in collection order.
        order = {check: n for n, check in enumerate(CHECKS)}
        items.sort(key=lambda item: order.get(self.checks.get(item.nodeid, ""), -1))

    def pytest_runtest_logreport(self, report: Any) -> None:
        check = self.checks.get(report.nodeid)
        if check is None:
            return
        skipped = report.skipped and isinstance(report.longrepr, tuple)
        reason = report.longrepr[2].removeprefix("Skipped: ") if skipped else ""
        properties = dict(report.user_properties)
        record(self.outcomes, report.nodeid, check, report.when, report.outcome, report.duration, reason,
               properties.get("residency"), properties.get("transfers"))

    def nothing_checked(self, suite: SuiteConfig) -> str:
        """Why this run checked nothing on the suite's device (``""`` when it did)."""
        cases = self.outcomes.values()
        if cases and all(c.outcome == "skipped" for c in cases):
            return "every case skipped: nothing was checked"
        absent = suite.absent_reason()
        if absent and any(c.reason == absent for c in cases):
            return f"the device under test is absent, its checks skipped: {absent}"
        return ""

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        why = self.nothing_checked(SuiteConfig.from_pytest(session.config))
        if why and exitstatus == 0:
            session.exitstatus = NOTHING_CHECKED

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any, config: Any) -> None:
        rows = summarize(self.outcomes)
        if not rows:
            return
        suite = SuiteConfig.from_pytest(config)
        title = (f"torchrec-ascend conformance: device {suite.device_name}, {suite.world_size} rank(s), "
                 f"{'quick' if suite.quick else 'full'} run")
        terminalreporter.write_sep("=", "conformance summary")
        for line in format_table(rows, title).splitlines():
            terminalreporter.write_line(line)
        transfers = format_transfers(transfer_rows(self.outcomes))
        if transfers:
            terminalreporter.write_line(
                f"host<->device copies and host syncs per training step on {suite.device_name}:"
            )
            for line in transfers.splitlines():
                terminalreporter.write_line(line)
        why = self.nothing_checked(suite)
        if why:
            terminalreporter.write_line(f"FAILED: {why} (exit status {NOTHING_CHECKED})", red=True)


def _case_id(item: Any) -> Optional[str]:
    """The parameter id of a suite test (``ID`` of ``test_case[ID]``), ``None`` for a test of no parameter."""
    callspec = getattr(item, "callspec", None)
    return callspec.id if callspec is not None else None


def pytest_collection_modifyitems(config: Any, items: List[Any]) -> None:
    wanted = set(SuiteConfig.from_pytest(config).cases)
    if not wanted:
        return
    ours = [item for item in items if PACKAGE_DIR in Path(str(item.path)).parents]
    unknown = wanted - {_case_id(item) for item in ours}
    if unknown:
        known = sorted({str(_case_id(item)) for item in ours if _case_id(item) is not None})
        raise pytest.UsageError(
            f"--case {', '.join(sorted(unknown))}: no case of the checks run has this id (ids are the part in "
            f"brackets of the test names; a quick run has fewer cases). The ids here: {', '.join(known)}"
        )
    dropped = [item for item in ours if _case_id(item) not in wanted]
    config.hook.pytest_deselected(items=dropped)
    items[:] = [item for item in items if item not in dropped]


def pytest_addoption(parser: Any) -> None:
    add_options(parser.getgroup("conformance", "torchrec-ascend conformance suite").addoption, cli=False)


def pytest_configure(config: Any) -> None:
    # fbgemm_gpu and torchrec announce their own deprecations on import: not the user's to act on.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:fbgemm_gpu.*")
    config.addinivalue_line("filterwarnings", "ignore::FutureWarning:torchrec.*")
    config.pluginmanager.register(_Summary(), "torchrec-ascend-conformance-summary")


@pytest.fixture(scope="session")
def suite(pytestconfig: Any) -> SuiteConfig:
    """The run's :class:`~torchrec_ascend.conformance_tests.config.SuiteConfig`."""
    return SuiteConfig.from_pytest(pytestconfig)

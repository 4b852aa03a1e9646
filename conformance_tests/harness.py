"""What every check module shares: parametrize by the derived cases, launch the script once, fetch a case's result.

A check module derives its cases from the suite settings (``cases.py``), parametrizes its test with them
(:func:`parametrize` from ``pytest_generate_tests``), launches its script once in a module-scoped fixture
(:func:`launch`) and reads each case's result in the test (:func:`result_of`); :func:`script_check` makes the hook
and the fixture. Skipped cases never launch anything.

Example::

    pytest_generate_tests, run = script_check(SCRIPT, cases_of)

    def test_case(case, request):
        result = result_of(request, "run", case)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from torchrec_ascend.conformance_tests.cases import Case
from torchrec_ascend.conformance_tests.config import ScriptRun, SuiteConfig


def parametrize(metafunc: Any, derive: Callable[[SuiteConfig], List[Case]], name: str = "case") -> None:
    """Parametrize the test's ``name`` argument with the check's cases, ids from :attr:`Case.id`."""
    if name in metafunc.fixturenames:
        cases = derive(SuiteConfig.from_pytest(metafunc.config))
        metafunc.parametrize(name, cases, ids=[c.id for c in cases])


def script_check(
    script: Path, cases_of: Callable[[SuiteConfig], List[Case]], world_size: Optional[int] = None,
    fixture: str = "run",
) -> Tuple[Callable[[Any], None], Any]:
    """A check module's ``pytest_generate_tests`` (the ``case`` argument takes ``cases_of``'s cases) and its
    module-scoped fixture ``fixture``, which launches ``script`` once for them (see :func:`launch`)."""

    def pytest_generate_tests(metafunc: Any) -> None:
        parametrize(metafunc, cases_of)

    @pytest.fixture(scope="module", name=fixture)
    def run(suite: SuiteConfig) -> ScriptRun:
        return launch(suite, script, cases_of(suite), world_size)

    return pytest_generate_tests, run


def launch(suite: SuiteConfig, script: Path, cases: List[Case], world_size: Optional[int] = None,
           timeout: float = 600.0) -> ScriptRun:
    """Run ``script`` for the runnable ``cases`` on the suite's device; skip when the device is not here.

    Raises:
        LaunchError: see :meth:`SuiteConfig.run_script`.
    """
    reason = suite.absent_reason()
    if reason:
        pytest.skip(reason)
    return suite.run_script(script, cases, world_size, timeout)


def result_of(request: Any, fixture: str, case: Case) -> Dict[str, Any]:
    """The result of ``case`` from the module's launch fixture, failing with the script's traceback on an error.

    Skips a case that carries a skip reason before the fixture (and its launch) is requested.
    """
    if case.skip:
        pytest.skip(case.skip)
    run: ScriptRun = request.getfixturevalue(fixture)
    result = run.results[case.id]
    assert not result.get("error"), result.get("traceback") or result["error"]
    return result

"""Check: every installed cache policy (or each one given with ``--policy``) passes the policy contract.

The contract kit (``torchrec_ascend.policies.contract.check_policy``) drives fresh instances the way a cache owner
does, over generated batches, against a dict model of residency: victims well formed and in range, capacity kept,
empty batches, huge IDs, determinism, and a ``state_dict`` round trip. The full run generates 30 examples per
property, the quick run 10.
"""

from __future__ import annotations

from typing import Any, List

import pytest

from torchrec_ascend.conformance_tests.cases import Case, policy_cases
from torchrec_ascend.conformance_tests.config import SuiteConfig, parse_policy
from torchrec_ascend.conformance_tests.harness import parametrize
from torchrec_ascend.errors import TorchRecAscendError

EXAMPLES = {False: 30, True: 10}  # quick -> hypothesis examples per property


def cases_of(suite: SuiteConfig) -> List[Case]:
    """One case per ``--policy`` given, else per installed policy and kind (see ``cases.policy_cases``)."""
    from torchrec_ascend.policies.registry import list_policies

    requested = [parse_policy(spec) for spec in suite.policies]
    try:
        installed = [] if requested else [(e.kind, e.name) for e in list_policies()]
    except TorchRecAscendError as err:  # a broken plugin: one failing case that says which, not a crash
        return [Case({"policy": "(installed policies)"}, {"error": str(err)})]
    return policy_cases(requested, installed)


def pytest_generate_tests(metafunc: Any) -> None:
    parametrize(metafunc, cases_of)


def test_contract(case: Case, suite: SuiteConfig) -> None:
    if "error" in case.expect:
        pytest.fail(f"listing the installed policies failed: {case.expect['error']}")
    from torchrec_ascend.policies.contract import check_policy

    try:
        report = check_policy(case.params["policy"], options=case.expect["options"], kind=case.params.get("kind"),
                              examples=EXAMPLES[suite.quick])
    except TorchRecAscendError as err:  # unknown name or option: the message lists the known ones
        pytest.fail(str(err))
    assert report.passed, str(report)

"""Check: the documented bad-input errors are raised, and each names what is wrong and where.

Hash tables (``errors/bad_inputs.py`` on one rank, unsharded and through the device's sharded paths): a negative
ID names the table and the feature, a full table with ``overflow="error"`` names the table and the way out, a
misspelled eviction policy names the table and suggests the closest, a KEY_VALUE cache smaller than one batch
names the table, a sharding type hash tables do not support (table_row_wise: the planner finds no option; a plan
written by hand is refused naming the table), a row_wise hash table sharing a module with a row_wise plain one.
In the suite's own process: an unknown device backend lists the valid names and suggests the closest; an unknown
policy or policy option lists the known ones and suggests the closest; and every row of the README's catalogue of bad
inputs (``errors/catalogue.py``: configs, constraints, IDs, batches, policies, plugins, devices, versions,
checkpoints, disks, data; sharded rows on a one-rank gloo group) raises its documented exception naming what is
wrong (``--quick``: the first row of each area).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from torchrec_ascend.conformance_tests.cases import Case, error_cases
from torchrec_ascend.conformance_tests.config import SuiteConfig
from torchrec_ascend.conformance_tests.errors import catalogue
from torchrec_ascend.conformance_tests.errors.catalogue import CATALOGUE, BadInput, message_of
from torchrec_ascend.conformance_tests.harness import result_of, script_check
from torchrec_ascend.errors import ConfigError

SCRIPT = Path(__file__).parent / "errors" / "bad_inputs.py"


def cases_of(suite: SuiteConfig) -> List[Case]:
    """The bad-input cases of the suite's device (see ``cases.error_cases``)."""
    return error_cases(suite.profile, suite.quick)


_cases_of_script, run = script_check(SCRIPT, cases_of, world_size=1)
#: Catalogue rows that only hold where their precondition does: row kind -> why the row cannot raise otherwise.
PRECONDITIONS = {"npu_without_torch_npu": lambda: importlib.util.find_spec("torch_npu") is not None
                 and "torch_npu is installed here"}


def catalogue_rows(suite: SuiteConfig) -> List[BadInput]:
    """Every catalogue row, or in quick runs the first of each area."""
    if not suite.quick:
        return list(CATALOGUE)
    firsts: Dict[str, BadInput] = {}
    for row in CATALOGUE:
        firsts.setdefault(row.area, row)
    return list(firsts.values())


def pytest_generate_tests(metafunc: Any) -> None:
    _cases_of_script(metafunc)
    if "row" in metafunc.fixturenames:
        rows = catalogue_rows(SuiteConfig.from_pytest(metafunc.config))
        metafunc.parametrize("row", rows, ids=[f"{row.area}-{row.kind}" for row in rows])


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    """A gloo group of this process alone (the default group), for the catalogue rows that shard a model."""
    with catalogue.one_rank_group():
        yield


def test_case(case: Case, request: Any) -> None:
    r = result_of(request, "run", case, trains=False)  # each case raises before anything trains
    expected = case.expect["raised"]  # that class or a subclass (a ConfigError is a ValueError)
    assert expected in r["kinds"], f"expected a {expected}, got {r['raised'] or 'no error'}: {r['message']}"
    missing = [name for name in case.expect["names"] if name not in r["message"]]
    assert not missing, f"the {expected} does not name {missing}: {r['message']!r}"


def test_unknown_backend_lists_the_names(suite: SuiteConfig) -> None:
    from torchrec_ascend import backends

    misspelled = suite.profile.name + "x"
    proc = subprocess.run(
        [sys.executable, "-c", "from torchrec_ascend import backends; backends.activate()"],
        env={**os.environ, backends.DEVICE_ENV: misspelled}, capture_output=True, text=True, timeout=120,
    )
    message = (proc.stderr.strip().splitlines() or [""])[-1]
    assert proc.returncode != 0 and "BackendError" in message, f"{backends.DEVICE_ENV}={misspelled} was accepted"
    missing = [name for name in backends.available_names() if name not in message]
    assert not missing, f"the BackendError does not list {missing}: {message!r}"
    assert f"Did you mean {suite.profile.name!r}" in message, message


def test_unknown_policy_suggests_the_closest() -> None:
    from torchrec_ascend.policies.registry import create_eviction_policy, list_policies

    name = list_policies("eviction")[0].name
    with pytest.raises(ConfigError) as err:
        create_eviction_policy(name + "x", capacity=8)
    message = str(err.value)
    assert f"did you mean {name!r}" in message and "Installed eviction policies" in message, message


def test_unknown_policy_option_suggests_the_closest() -> None:
    from torchrec_ascend.policies.registry import create_eviction_policy, list_policies

    entry = next((e for e in list_policies("eviction") if e.option_names()), None)
    if entry is None:
        pytest.skip("no installed eviction policy declares named options")
    option = (entry.option_names() or [])[0]
    with pytest.raises(ConfigError) as err:
        create_eviction_policy(entry.name, capacity=8, **{option + "x": 1})
    message = str(err.value)
    assert repr(entry.name) in message and f"did you mean {option!r}" in message, message


def test_catalogue(row: BadInput, one_rank_group: None, tmp_path: Path) -> None:
    why_not = PRECONDITIONS.get(row.kind, lambda: "")()
    if why_not:
        pytest.skip(f"{row.input} cannot happen here: {why_not}")
    message = message_of(row, tmp_path)
    assert row.fragment in message, f"{row.input}: the {row.raises.__name__} does not say {row.fragment!r}: {message!r}"

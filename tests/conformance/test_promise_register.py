"""The promise register (``torchrec_ascend/conformance_tests/PROMISES.md``) names only cases the suite has, and
only faults the teeth run.

Oracle: the suite's own collection (``pytest --collect-only`` of ``torchrec_ascend.conformance_tests``, a full run on
the CPU with 2 ranks): every ``check::test[id]`` the register names (``*`` matching any run of characters) must match
a collected case, and every row must name a case or say ``none`` / ``pending``. Every fault of the teeth column must
be one the fault plugin defines (``conformance_faults.FAULTS``) and the teeth tests run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import List, Set, Tuple

import pytest

from torchrec_ascend import conformance_tests

REGISTER = Path(conformance_tests.__file__).parent / "PROMISES.md"
REFERENCE = re.compile(r"`(\w+)::(test_\w+(?:\[[^\]`]*\])?)`")

HERE = Path(__file__).parent


def register_cells() -> List[List[str]]:
    """The cells of every table row of the register (header and rule rows left out)."""
    rows = []
    for line in REGISTER.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3 and cells[0] not in ("promise", "---"):
            rows.append(cells)
    return rows


def register_rows() -> List[Tuple[str, str]]:
    """``(promise, case column)`` of every table row of the register."""
    return [(cells[0], cells[1]) for cells in register_cells()]


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> Set[str]:
    """``check::test[id]`` of every case the suite collects."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "torchrec_ascend.conformance_tests", "--collect-only", "-q",
         "-p", "no:cacheprovider"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path_factory.mktemp("collect"),
    )
    ids = set(re.findall(r"test_(\w+)\.py::(test_\w+(?:\[[^\]]*\])?)", proc.stdout))
    assert ids, proc.stdout + proc.stderr
    return {f"{check}::{name}" for check, name in ids}


def test_every_case_the_register_names_exists(collected: Set[str]) -> None:
    missing = []
    for promise, cases in register_rows():
        for check, name in REFERENCE.findall(cases):
            pattern = re.compile(re.escape(f"{check}::{name}").replace(r"\*", ".*"))
            if not any(pattern.fullmatch(case) for case in collected):
                missing.append(f"{check}::{name} ({promise[:60]})")
    assert not missing, "the register names cases the suite does not have: " + "; ".join(missing)


def test_every_promise_names_its_check_or_why_not() -> None:
    rows = register_rows()
    assert len(rows) > 30
    bare = [p for p, cases in rows if not REFERENCE.search(cases) and not re.search(r"\b(none|pending)\b", cases)]
    assert not bare, f"rows naming no case and not marked none/pending: {bare}"


def test_every_fault_the_register_names_bites_in_the_teeth_tests() -> None:
    defined = set(re.findall(r'^    "(\w+)": _after_import\(', (HERE / "conformance_faults.py").read_text(), re.M))
    teeth = (HERE / "test_conformance_teeth.py").read_text()
    named = {name for cells in register_cells() if cells[1] != "none" for name in re.findall(r"`(\w+)`", cells[-1])}
    assert len(named) > 40 and len(defined) > 40
    unknown = named - defined
    assert not unknown, f"the register's teeth name faults conformance_faults.py does not define: {sorted(unknown)}"
    unrun = {name for name in named if f'"{name}"' not in teeth}
    assert not unrun, f"the register's teeth name faults no teeth test runs: {sorted(unrun)}"

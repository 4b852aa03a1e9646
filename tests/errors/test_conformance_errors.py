"""The conformance suite's ``errors`` check runs in CI exactly as ``torchrec-ascend conformance --only errors``
runs it (a pytest of ``conformance_tests/test_errors.py``: the sharded negative-ID error in the row-wise input dist,
the KEY_VALUE "cache too small for one batch" error, the full table, the misspelled policy, on one rank through
``errors/bad_inputs.py``; the unknown backend and policy names). Every case must pass; none may be skipped."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from torchrec_ascend.cli import conformance as cli

pytestmark = pytest.mark.multiprocess


def test_conformance_errors_check_passes(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    junit = tmp_path / "errors.xml"
    argv = cli.pytest_args(parser.parse_args(["conformance", "--only", "errors", "--junit", str(junit)]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run([sys.executable, "-m", "pytest", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    names = [c.get("name") for c in cases if not list(c)]  # passed: no failure, error or skipped child
    assert any("negative_id" in n and "row_wise" in n for n in names), names
    assert any("small_cache" in n for n in names), names
    assert len(names) >= 8, names

"""The lint step (scripts/lint, run by scripts/run-tests on the tr18 lane) fails on findings.

Each linter runs with the repository's own configuration (pyproject.toml) on a throwaway file with one known finding,
and on the same file fixed as the control; the script itself must fail when a linter does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "pyproject.toml")


def _run(args: List[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_ruff_fails_on_an_unused_import_and_a_stale_noqa(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nx = 1  # noqa: E501\n")
    result = _run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", CONFIG, str(bad)], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "F401" in result.stdout and "RUF100" in result.stdout
    bad.write_text("x = 1\n")
    control = _run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", CONFIG, str(bad)], tmp_path)
    assert control.returncode == 0, control.stdout + control.stderr


def test_mypy_fails_on_a_type_error_and_a_stale_ignore(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('x: int = "a"\ny: int = 1  # type: ignore[assignment]\n')
    command = [sys.executable, "-m", "mypy", "--config-file", CONFIG, "--cache-dir", str(tmp_path / "cache"), str(bad)]
    result = _run(command, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "bad.py:1: error" in result.stdout and "[assignment]" in result.stdout
    assert "bad.py:2: error" in result.stdout and "[unused-ignore]" in result.stdout
    bad.write_text("x: int = 1\n")
    control = _run(command, tmp_path)
    assert control.returncode == 0, control.stdout + control.stderr


def test_lint_script_fails_when_a_linter_fails(tmp_path: Path) -> None:
    failing = tmp_path / "python"
    failing.write_text("#!/bin/sh\necho \"linter $* found something\"\nexit 1\n")
    failing.chmod(0o755)
    result = _run(["bash", str(REPO / "scripts" / "lint"), str(failing)], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "-m ruff check" in result.stdout and "-m mypy" in result.stdout  # both ran: one run shows everything
    assert "lint: ruff and mypy FAILED" in result.stdout

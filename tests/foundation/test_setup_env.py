"""scripts/setup-env's output helpers, run in bash on fake pip output (the real install takes minutes).

The helpers are cut out of the script (``say``, ``step``, ``resolver_filter``, ``pip_q``) and run with a fake
``$py`` that prints a given output and exits with a given status. Oracle: the text pip printed, line by line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup-env"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

RESOLVER = (
    "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed. "
    "This behaviour is the source of the following dependency conflicts."
)
TORCHREC_CONFLICT = "torchrec 1.8.0 requires fbgemm-gpu, which is not installed."
OTHER_CONFLICT = "torchmetrics 1.0.3 requires numpy<2, but you have numpy 2.1.0 which is incompatible."


def run_helpers(body: str, tmp_path: Path, pip_output: str = "", pip_status: int = 0) -> subprocess.CompletedProcess:
    """Run ``body`` in bash with setup-env's helpers defined and ``$py`` a fake printing ``pip_output``."""
    (tmp_path / "pip_output").write_text(pip_output)
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'pip_output'}\nexit {pip_status}\n")
    fake.chmod(0o755)
    helpers = "/^say()/p; /^step()/,/^}/p; /^resolver_filter()/,/^}/p; /^pip_q()/,/^}/p"
    program = textwrap.dedent(
        f"""\
        set -euo pipefail
        eval "$(sed -n '{helpers}' '{SCRIPT}')"
        work='{tmp_path}' py='{fake}' constraints=/dev/null
        """
    )
    env = {"PATH": os.environ["PATH"], "SETUP_ENV_TICK": "1"}
    return subprocess.run(["bash", "-c", program + body], capture_output=True, text=True, timeout=60, env=env)


def test_the_deliberate_fbgemm_gpu_conflict_is_not_shown(tmp_path: Path) -> None:
    pip = f"WARNING: something pip warns about\n{RESOLVER}\n{TORCHREC_CONFLICT}\nlast line\n"
    proc = run_helpers("pip_q --no-deps torchrec", tmp_path, pip)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["WARNING: something pip warns about", "last line"]


def test_a_resolver_block_with_another_conflict_is_shown_whole(tmp_path: Path) -> None:
    pip = f"{RESOLVER}\n{TORCHREC_CONFLICT}\n{OTHER_CONFLICT}\n"
    proc = run_helpers("pip_q -e .", tmp_path, pip)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [RESOLVER, TORCHREC_CONFLICT, OTHER_CONFLICT]


def test_a_failing_pip_shows_its_whole_output_and_fails_the_script(tmp_path: Path) -> None:
    pip = f"{RESOLVER}\n{TORCHREC_CONFLICT}\nerror: subprocess-exited-with-error\nkernels/csrc/cpu/id_map.cpp:1: bad\n"
    body = "step 'compiling the native ops: about 3 minutes' pip_q -e .\necho not reached"
    proc = run_helpers(body, tmp_path, pip, 3)
    assert proc.returncode == 3
    assert "not reached" not in proc.stdout
    assert proc.stderr.splitlines()[:4] == pip.splitlines()  # everything, the resolver block included
    assert "FAILED (exit 3): pip install -e ." in proc.stderr


def test_a_step_says_when_it_starts_and_while_it_runs(tmp_path: Path) -> None:
    """A tick a second here (30 s in real use); none once the step is over."""
    proc = run_helpers("step 'compiling the native ops: about 3 minutes' sleep 2.5\nsleep 3\nsay done", tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "[setup-env 0:00] compiling the native ops: about 3 minutes"
    assert lines[-1].endswith("] done")
    still = lines[1:-1]
    assert 1 <= len(still) <= 2 and all(line.endswith("] ... still compiling the native ops") for line in still)


def test_the_local_index_location_notes_are_not_shown(tmp_path: Path) -> None:
    """pip's note about a configured local index without a package's folder is dropped; other warnings stay."""
    note = "WARNING: Location 'file:///opt/pypi/simple/torch/' is ignored: it is neither a file nor a directory."
    pip = f"{note}\nWARNING: something pip warns about\n{note.replace('torch', 'tqdm')}\n"
    proc = run_helpers("pip_q torch", tmp_path, pip)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["WARNING: something pip warns about"]

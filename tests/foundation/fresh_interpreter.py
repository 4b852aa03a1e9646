"""Run Python code in a fresh interpreter and read back the JSON it reports (for tests that need a clean process).

Tests that check what ``import torch`` / ``import torchrec`` do cannot run in the pytest process, which imported
both long ago. The child gets a clean environment (our switches removed, one OpenMP thread), runs from the
repository root, and reports with :func:`report` — imported by the child as ``from fresh_interpreter import report``.

Starting an interpreter and importing torchrec costs seconds: :func:`start_all` runs a module's children two at a
time (this machine has two cores) while its tests wait on the one they need.

Example::

    facts = run_python("import sys, torch; report({'torchrec': 'torchrec' in sys.modules})")
    assert facts["torchrec"] is False
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
STANDINS = REPO / "tests" / "standins" / "torch_npu_standin"
MARKER = "FRESH-INTERPRETER-REPORT:"
PARALLEL_CHILDREN = 2
# Inherited settings that would change what the child does.
_CLEARED = (
    "TORCHREC_ASCEND_",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
    "TORCH_NPU_STANDIN_",
    "FBGEMM_ASCEND_STANDIN_",
    "PYTHONPATH",
)


def report(facts: Dict[str, Any]) -> None:
    """Print ``facts`` for the parent (call once, at the end of the child's code)."""
    print(MARKER + json.dumps(facts), flush=True)


def run_python(
    code: str,
    env: Optional[Mapping[str, str]] = None,
    standins: bool = False,
    expect_exit: int = 0,
    timeout: float = 180.0,
) -> Dict[str, Any]:
    """Run ``code`` with ``python -c`` and return the dict it passed to :func:`report`.

    Args:
        code: the program; ``report`` must be imported from this module by the program.
        env: extra environment variables.
        standins: put the torch_npu / fbgemm_ascend stand-ins first on ``PYTHONPATH``.
        expect_exit: the exit status the program must end with.
        timeout: seconds before the child is killed (a hang fails the test).

    Returns:
        The reported facts, plus ``"_stderr"`` (the child's standard error).

    Raises:
        AssertionError: wrong exit status, or nothing reported; the message carries the child's output.
    """
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(_CLEARED)}
    paths = ([str(STANDINS)] if standins else []) + [str(HERE)]
    child_env.update({"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": os.pathsep.join(paths)})
    child_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", code], env=child_env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    tail = f"\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    assert proc.returncode == expect_exit, f"child exited {proc.returncode}, expected {expect_exit}{tail}"
    assert lines or expect_exit != 0, f"child reported nothing{tail}"
    facts: Dict[str, Any] = json.loads(lines[-1][len(MARKER):]) if lines else {}
    facts["_stderr"] = proc.stderr
    facts["_stdout"] = proc.stdout
    return facts


def start_all(programs: Mapping[str, Mapping[str, Any]]) -> Dict[str, "Future[Dict[str, Any]]"]:
    """Start :func:`run_python` for each ``name -> keyword arguments``; ``future.result()`` gives its facts.

    A child that fails raises from its own ``result()`` only, so one broken case fails one test.

    Example::

        children = start_all({"plain": {"code": PROGRAM}, "off": {"code": PROGRAM, "env": {"X": "0"}}})
        children["off"].result()["state"]
    """
    pool = ThreadPoolExecutor(max_workers=PARALLEL_CHILDREN, thread_name_prefix="fresh-interpreter")
    futures = {name: pool.submit(run_python, **kwargs) for name, kwargs in programs.items()}
    pool.shutdown(wait=False)
    return futures

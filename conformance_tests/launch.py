"""Launch a multi-process script with torchrun and collect its JSON results (the suite's process-group runner).

One launch runs many cases in one process group: starting processes and importing torchrec costs seconds, so the
suite pays it once per script, not once per case.

Example::

    results = run_distributed(STOCK_SCRIPTS / "sharding_matrix.py", world_size=2, cases=[{"kind": "copy"}])
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

STOCK_SCRIPTS = Path(__file__).parent / "stock"


class LaunchError(RuntimeError):
    """The distributed run itself failed (not a case): the message carries the tail of its output."""


def run_distributed(
    script: Path,
    world_size: int,
    cases: List[Dict[str, Any]],
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 300.0,
) -> Dict[str, Any]:
    """Run ``script`` on ``world_size`` local ranks (gloo on CPU) and return what rank 0 wrote.

    Args:
        script: a script accepting ``--cases JSON --out PATH`` (see ``stock/sharding_matrix.py``).
        world_size: number of ranks.
        cases: the cases, passed as JSON.
        env: extra environment variables for the ranks (e.g. ``TORCHREC_ASCEND_AUTOLOAD=0``).
        timeout: seconds before the run is killed (a hang is a failure, never a wait forever).

    Raises:
        LaunchError: the launch failed, timed out, or wrote no results.
    """
    with tempfile.TemporaryDirectory(prefix="torchrec_ascend_") as tmp:
        out = Path(tmp) / "results.json"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
            str(script), "--cases", json.dumps(cases), "--out", str(out),
        ]
        # One thread per rank and passive OpenMP waits: spinning ranks stall each other on small machines.
        run_env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", **(env or {})}
        try:
            proc = subprocess.run(command, env=run_env, cwd=tmp, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise LaunchError(f"{script.name} timed out after {timeout:.0f} s:\n{_tail(err.stdout, err.stderr)}")
        if proc.returncode != 0 or not out.exists():
            raise LaunchError(f"{script.name} exited {proc.returncode}:\n{_tail(proc.stdout, proc.stderr)}")
        return json.loads(out.read_text())


def _tail(*streams: Any, limit: int = 6000) -> str:
    text = "\n".join(s.decode() if isinstance(s, bytes) else (s or "") for s in streams)
    return text[-limit:]

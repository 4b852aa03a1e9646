"""Launch a multi-process script with torchrun and collect its JSON results (the suite's process-group runner).

One launch runs many cases in one process group: starting processes and importing torchrec costs seconds, so the
suite pays it once per script, not once per case.

Where the ranks run is passed through the environment, so the scripts need no device arguments: the suite sets
:data:`DEVICE_ENV` (the ``torch.device`` type) and :data:`BACKEND_ENV` (the collective backend) from the device's
backend profile (:func:`script_env`); a script reads them with :func:`script_device` and
:func:`process_group_backend` and reports ``info["device"]`` in its results (:func:`ran_on` reads it back). Unset,
they mean the CPU with gloo. With :data:`EMULATE_ENV` set to ``1`` the ranks run the script through
``emulated_run.py``, which installs ``torchrec_ascend.testing``'s emulated NPU first (:func:`python_command`).

Example::

    results = run_distributed(STOCK_SCRIPTS / "sharding_matrix.py", world_size=2, cases=[{"kind": "copy"}])
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

# The scripts' side lives with the stock scripts (which never import this package): re-exported here.
from torchrec_ascend.conformance_tests.stock.device_env import (  # noqa: F401  (re-exported)
    BACKEND_ENV,
    DEFAULT_DEVICE,
    DEVICE_ENV,
    process_group_backend,
    script_device,
)

STOCK_SCRIPTS = Path(__file__).parent / "stock"
#: ``1``: the ranks run on torchrec_ascend.testing's emulated NPU (``torchrec-ascend conformance --emulate``).
EMULATE_ENV = "TORCHREC_ASCEND_CONFORMANCE_EMULATE"
EMULATED_RUN = "torchrec_ascend.conformance_tests.emulated_run"
#: The emulated npu's device memory in bytes (``torchrec_ascend.testing.emulated_npu.MEMORY_ENV``; not imported:
#: that module is the emulator's, loaded in the ranks only).
EMULATOR_MEMORY_ENV = "TORCHREC_ASCEND_EMULATOR_MEMORY"


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
        # One thread per rank and passive OpenMP waits: spinning ranks stall each other on small machines.
        run_env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", **(env or {})}
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}"]
        command = python_command(script, run_env, launcher) + ["--cases", json.dumps(cases), "--out", str(out)]
        try:
            proc = subprocess.run(command, env=run_env, cwd=tmp, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            tail = _tail(err.stdout, err.stderr)
            raise LaunchError(f"{script.name} timed out after {timeout:.0f} s:\n{tail}") from err
        if proc.returncode != 0 or not out.exists():
            raise LaunchError(f"{script.name} exited {proc.returncode}:\n{_tail(proc.stdout, proc.stderr)}")
        return json.loads(out.read_text())


def script_env(device_type: str, collective_backend: str, emulate: bool = False, memory: int = 0) -> Dict[str, str]:
    """The environment telling a script's ranks where to run (pass it as ``run_distributed(..., env=...)``).

    Args:
        device_type: ``torch.device`` type, e.g. the backend profile's ``device_type``.
        collective_backend: ``torch.distributed`` backend, e.g. the profile's ``collective_backend``.
        emulate: the ranks run on the emulated NPU (see :func:`python_command`).
        memory: with ``emulate``, each emulated npu's device memory in bytes (0: the emulator's default, the npu
            profile's HBM), passed as ``torchrec_ascend.testing``'s ``TORCHREC_ASCEND_EMULATOR_MEMORY``.

    Example::

        profile = backends.profile_for("cpu")
        run_distributed(script, 2, cases, env=script_env(profile.device_type, profile.collective_backend))
    """
    env = {DEVICE_ENV: device_type, BACKEND_ENV: collective_backend, EMULATE_ENV: "1" if emulate else "0"}
    if emulate and memory:
        env[EMULATOR_MEMORY_ENV] = str(int(memory))
    return env


def python_command(script: Path, env: Mapping[str, str], python: Optional[List[str]] = None) -> List[str]:
    """The command running ``script`` with ``python`` (default this interpreter; e.g. torchrun's), through
    ``emulated_run.py`` when ``env`` asks for the emulated NPU (:data:`EMULATE_ENV`).

    Example::

        python_command(Path("doctor_state.py"), script_env("npu", "hccl", emulate=True))
        # [sys.executable, '-m', 'torchrec_ascend.conformance_tests.emulated_run', 'doctor_state.py']
    """
    python = python or [sys.executable]
    if env.get(EMULATE_ENV) == "1":
        return [*python, "-m", EMULATED_RUN, str(script)]
    return [*python, str(script)]


def ran_on(run: Mapping[str, Any]) -> str:
    """The device type a finished run reports in ``info["device"]`` (``cpu`` for scripts that do not report it).

    Example::

        ran_on(run_distributed(script, 2, cases))   # 'cpu'
    """
    return str((run.get("info") or {}).get("device", DEFAULT_DEVICE))


def _tail(*streams: Any, limit: int = 6000) -> str:
    """The end of the output, after the first error a rank raised: a rank that failed first often leaves the other
    ranks waiting in a collective, whose timeouts then fill the end."""
    text = "\n".join(s.decode() if isinstance(s, bytes) else (s or "") for s in streams)
    first = next((line for line in text.splitlines() if _ERROR_LINE.match(line)), "")
    tail = text[-limit:]
    return tail if not first or first in tail else f"first error: {first[:2000]}\n...\n{tail}"


#: A Python exception line (``RuntimeError: ...``, ``pkg.module.SomeError: ...``), as a traceback ends.
_ERROR_LINE = re.compile(r"^(\[rank\d+\]: )?[\w.]*(Error|Exception): ")

"""The stock TorchRec DLRM script, unchanged, on two CPU ranks: its row_wise table is planned and trained."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DLRM = ROOT / "examples" / "dlrm_stock.py"
STEPS = 10


def test_two_ranks_plan_row_wise_and_train():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(DLRM),
               "--steps", str(STEPS), "--batch-size", "32"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert result.returncode == 0 or finalization_abort(result), result.stdout[-3000:] + result.stderr[-5000:]
    # Stock TorchRec refuses row_wise on CPU; with the plugin installed the planner keeps the constraint.
    assert re.search(r"\.t_user: row_wise on ranks \[0, 1\]", result.stdout), result.stdout
    assert f"trained {STEPS} steps on 2 rank(s), cpu" in result.stdout
    # Random labels: the binary cross-entropy stays near ln 2 (a broken backward or all-to-all would not).
    [loss] = [float(x) for x in re.findall(rf"step {STEPS}: loss ([0-9.]+)", result.stdout)]
    assert abs(loss - math.log(2)) < 0.2


def finalization_abort(result: subprocess.CompletedProcess) -> bool:
    """Training finished on every rank, then a rank aborted while the interpreter shut down: torch's gloo threads
    can outlive it ("terminate called without an active exception", a known torch issue the stock script cannot
    work around; our own scripts end with os._exit). Any other failure, or one before the end, still fails."""
    finished = f"trained {STEPS} steps" in result.stdout
    return finished and "terminate called without an active exception" in result.stderr and "Traceback" not in (
        result.stderr.split("terminate called without an active exception")[0])

"""The stock TorchRec DLRM script, unchanged, on two CPU ranks: its row_wise table is planned and trained exactly as
the unsharded model trains on the global batch, and the script exits 0 under torchrun, with the plugin and
without it (``TORCHREC_ASCEND_AUTOLOAD=0``, every table table_wise: a plan stock TorchRec supports on CPU)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DLRM = ROOT / "examples" / "dlrm_stock.py"
STEPS = 10
# Both models sum the same float32 values in a different order; a wrong gradient, lookup or all-to-all moves the
# loss by 1e-2 or more within a few steps.
LOSS_TOLERANCE = 1e-4


def run(*args: str, env: dict = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", **(env or {})}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(DLRM),
               "--steps", str(STEPS), "--batch-size", "32", "--reference", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def loss_difference(result: subprocess.CompletedProcess) -> float:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert f"trained {STEPS} steps on 2 rank(s), cpu" in result.stdout
    [diff] = re.findall(rf"largest loss difference ([0-9.e+-]+) over {STEPS} steps", result.stdout)
    return float(diff)


def test_row_wise_trains_as_the_unsharded_model_and_exits_cleanly():
    result = run()
    # Stock TorchRec refuses row_wise on CPU; with the plugin installed the planner keeps the constraint.
    assert re.search(r"\.t_user: row_wise on ranks \[0, 1\]", result.stdout), result.stdout
    assert loss_difference(result) <= LOSS_TOLERANCE


def test_without_the_plugin_a_stock_plan_trains_and_exits_cleanly():
    result = run("--user-sharding", "table_wise", env={"TORCHREC_ASCEND_AUTOLOAD": "0"})
    assert re.search(r"\.t_user: table_wise on ranks \[\d\]", result.stdout), result.stdout
    assert loss_difference(result) <= LOSS_TOLERANCE

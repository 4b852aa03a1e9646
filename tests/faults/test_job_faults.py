"""The main job (examples/movielens_hstu) against SIGTERM and a killed rank under torchrun, on a tiny data set.

Oracle: the same job run without a fault. A job stopped and resumed must end with the same model, bit for bit
(``model_digest``: dense parameters, AdamW state, every item's row and optimizer state from every tier) and the same
loss at every step. Faults are real signals (``fault_at_step.py`` sends them at a seeded random step).
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from test_train_job import write_synthetic_wheel

pytestmark = pytest.mark.slow  # SIGTERM 24 s, kill -9 16 s (2 ranks) and 48 s (4 ranks) here, with the references
ROOT = Path(__file__).resolve().parents[2]
FAULT_AT_STEP = Path(__file__).with_name("fault_at_step.py")
WITH_POLICY = ROOT / "tests" / "examples" / "with_example_policy.py"
TRAIN = ROOT / "examples" / "movielens_hstu" / "train.py"
EPOCHS, STEPS_PER_EPOCH = 6, 6  # 96 windows, 16 a step: 2 ranks x 8 windows, or 4 ranks x 4
WINDOWS_PER_STEP = 16  # a rank's batch is this over the world size: every shard's cache holds a step's items
SETTINGS = ["--epochs", str(EPOCHS), "--max-seq-len", "8", "--dim", "16", "--negatives", "8", "--dropout", "0.1",
            "--save-every", "10"]


def torchrun(data: Path, out: Path, world_size: int = 2, max_restarts: int = 0,
             faults: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCHREC_ASCEND_DATA": str(data), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "TORCHREC_ASCEND_TEST_FAULTS": faults, "TORCHREC_ASCEND_COLLECTIVE_TIMEOUT_S": "20"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world_size),
               "--max-restarts", str(max_restarts), str(FAULT_AT_STEP), str(WITH_POLICY), str(TRAIN), "--out",
               str(out), *SETTINGS, "--batch-size", str(WINDOWS_PER_STEP // world_size)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


def metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    write_synthetic_wheel(folder)
    return folder


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """The uninterrupted run, per world size."""
    runs = {}

    def run(world_size: int) -> dict:
        if world_size not in runs:
            out = tmp_path_factory.mktemp(f"reference{world_size}")
            result = torchrun(data, out, world_size)
            assert result.returncode == 0, result.stderr[-5000:]
            runs[world_size] = metrics(out)
        return runs[world_size]

    return run


def assert_same_model(resumed: dict, reference: dict) -> None:
    assert resumed["steps"] == reference["steps"] == EPOCHS * STEPS_PER_EPOCH
    assert resumed["losses"] == reference["losses"]  # every step, bit for bit, after the resume too
    assert resumed["model_digest"] == reference["model_digest"]
    assert resumed["cache"]["initialised"] == reference["cache"]["initialised"]  # no row lost and re-created


def test_sigterm_at_a_random_step_resumes_bit_for_bit(data, reference, tmp_path):
    """One rank gets SIGTERM at a seeded random step: both stop after the same step, save, exit 143, torchrun
    restarts them, they resume from that save and end with the uninterrupted run's model."""
    rng = random.Random(29)
    step, rank = rng.randrange(1, EPOCHS * STEPS_PER_EPOCH - 3), rng.randrange(2)
    result = torchrun(data, tmp_path, max_restarts=1, faults=f"0:TERM:{rank}:{step}")
    assert result.returncode == 0, result.stderr[-5000:]
    assert "exitcode: 143" in result.stderr and "stopped by SIGTERM: saved step" in result.stdout
    resumed = metrics(tmp_path)
    # both ranks stopped after the step the signal came at, plus the batches in flight (pipeline depth 3)
    assert len(resumed["resumed_at"]) == 1 and step <= resumed["resumed_at"][0] <= step + 2
    assert_same_model(resumed, reference(2))


@pytest.mark.parametrize("world_size", [2, 4])
def test_killed_rank_is_named_and_torchrun_resumes_from_the_last_save(data, reference, tmp_path, world_size):
    """kill -9 of one rank mid-training: the others stop naming it, torchrun --max-restarts=1 restarts the job from
    the last complete save (every 10 steps), and the run ends with the uninterrupted run's model."""
    steps = EPOCHS * STEPS_PER_EPOCH
    rng = random.Random(world_size)
    step, victim = rng.randrange(14, steps - 2), rng.randrange(world_size)  # after the first save (step 10 + 2)
    result = torchrun(data, tmp_path, world_size, max_restarts=1, faults=f"0:KILL:{victim}:{step}")
    assert result.returncode == 0, result.stderr[-5000:]
    assert f"RankLostError: rank {victim} of {world_size} lost" in result.stderr
    resumed = metrics(tmp_path)
    assert len(resumed["resumed_at"]) == 1 and resumed["resumed_at"][0] % 10 == 2 and resumed["resumed_at"][0] < step
    ref = reference(world_size)
    assert resumed["losses"] == ref["losses"] and resumed["model_digest"] == ref["model_digest"]

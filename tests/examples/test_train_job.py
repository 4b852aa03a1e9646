"""The MovieLens HSTU job end to end, in one process, on a small synthetic data set that has a learnable pattern."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import torch

from torchrec_ascend.datasets import movielens

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "movielens_hstu" / "train.py"


def write_synthetic_wheel(folder: Path, users: int = 48, length: int = 16, items: int = 30) -> None:
    """Each user walks the catalogue in order (item i is followed by item i + 1, cyclically) from a random start."""
    g = torch.Generator().manual_seed(0)
    lines = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    for user in range(1, users + 1):
        start = int(torch.randint(items, (1,), generator=g))
        lines += [f"{user}\t{(start + t) % items + 1}\t4\t{1000 + t}" for t in range(length)]
    with zipfile.ZipFile(folder / movielens.RECBOLE_WHEEL, "w") as archive:
        archive.writestr(movielens.ML100K_INTER, "\n".join(lines) + "\n")


def test_job_learns_pattern_and_writes_outputs(tmp_path):
    write_synthetic_wheel(tmp_path)
    env = {**os.environ, movielens.DATA_ENV: str(tmp_path), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    env.pop("RANK", None)
    out = tmp_path / "out"
    command = [sys.executable, str(TRAIN), "--out", str(out), "--epochs", "15", "--batch-size", "16",
               "--max-seq-len", "8", "--dim", "16", "--negatives", "8", "--dropout", "0"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "NDCG@10" in result.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["users"] == 48 and metrics["steps"] == 15 * (48 * 2 // 16)  # 2 windows of a 15-item history per user
    for name in ("hstu_hr", "hstu_ndcg", "popularity_hr", "popularity_ndcg"):
        assert 0.0 <= metrics[name] <= 1.0
    # The next item is fully determined by the last one: a sequence model must rank it far above popularity.
    assert metrics["hstu_ndcg"] > metrics["popularity_ndcg"] + 0.2
    assert (out / "training.png").stat().st_size > 0 and (out / "checkpoint" / ".metadata").is_file()

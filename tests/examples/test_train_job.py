"""The MovieLens HSTU job end to end on two ranks, on a small synthetic data set that has a learnable pattern.

Everything the job shows runs here: the hash item table, KEY_VALUE with a cache smaller than the catalogue, the
example eviction policy, row_wise sharding over two processes, the hybrid pipeline, evaluation and the checkpoint.
"""

import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import torch

from torchrec_ascend import Saver
from torchrec_ascend.datasets import movielens

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "movielens_hstu" / "train.py"
WITH_POLICY = Path(__file__).with_name("with_example_policy.py")
USERS, LENGTH, ITEMS = 48, 16, 200
EPOCHS, BATCH, MAX_SEQ_LEN = 12, 4, 8


def write_synthetic_wheel(folder: Path) -> int:
    """Each user walks the catalogue in order (item i is followed by item i + 1, cyclically) from a random start.

    Returns:
        int: the number of distinct items in the data.
    """
    g = torch.Generator().manual_seed(0)
    lines = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    items = set()
    for user in range(1, USERS + 1):
        start = int(torch.randint(ITEMS, (1,), generator=g))
        walk = [(start + t) % ITEMS + 1 for t in range(LENGTH)]
        items.update(walk)
        lines += [f"{user}\t{item}\t4\t{1000 + t}" for t, item in enumerate(walk)]
    with zipfile.ZipFile(folder / movielens.RECBOLE_WHEEL, "w") as archive:
        archive.writestr(movielens.ML100K_INTER, "\n".join(lines) + "\n")
    return len(items)


def test_job_learns_pattern_with_every_part(tmp_path):
    num_items = write_synthetic_wheel(tmp_path)
    env = {**os.environ, movielens.DATA_ENV: str(tmp_path), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    out = tmp_path / "out"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(WITH_POLICY), str(TRAIN), "--out", str(out), "--epochs", str(EPOCHS),
               "--batch-size", str(BATCH), "--max-seq-len", str(MAX_SEQ_LEN), "--dim", "16", "--negatives", "8",
               "--dropout", "0"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "row_wise on ranks [0, 1], key_value kernel" in result.stdout
    assert "eviction policy 'decayed_lfu'" in result.stdout and "NDCG@10" in result.stdout

    metrics = json.loads((out / "metrics.json").read_text())
    windows = USERS * 2  # a 15-item training sequence gives 2 windows of at most 9 items
    assert metrics["users"] == USERS and metrics["steps"] == EPOCHS * math.ceil(windows / (2 * BATCH))
    for name in ("hstu_hr", "hstu_ndcg", "popularity_hr", "popularity_ndcg"):
        assert 0.0 <= metrics[name] <= 1.0
    # The next item is fully determined by the last one: a sequence model must rank it far above popularity.
    assert metrics["hstu_ndcg"] > metrics["popularity_ndcg"] + 0.2

    cache = metrics["cache"]
    assert cache["cache_rows"] < num_items  # the cache cannot hold the catalogue...
    assert cache["evicted"] > 0 and cache["swapped_in"] > 0  # ...so rows left it and came back with their state
    assert cache["initialised"] == num_items  # each item's row was created once: none was lost and re-created
    rates = metrics["cache_hit_rate_per_epoch"]
    assert len(rates) == EPOCHS and all(0.0 < rate < 1.0 for rate in rates)
    steps = metrics["steps"]
    assert (out / "training.png").stat().st_size > 0
    assert (out / "checkpoint" / "dense" / f"step-{steps:08d}" / ".metadata").is_file()  # only the last one kept
    saves = Saver.versions(str(out / "checkpoint" / "sparse"))  # every --save-every (100) steps, and at the end
    assert [save.kind for save in saves] == ["full"] + ["incremental"] * (steps // 100) and saves[-1].world_size == 2

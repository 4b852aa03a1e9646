"""TorchRec's own sharding test harness passes with KEY_VALUE tables as it does with FUSED ones (table_wise and
row_wise, 2 gloo ranks): its oracle is the unsharded TorchRec model, its weights written into the sharded model's
state_dict() with copy_ (see torchrec_harness.py, run in its own interpreter for its forkserver workers)."""

import os
import subprocess
import sys

import pytest

HARNESS = os.path.join(os.path.dirname(__file__), "torchrec_harness.py")


@pytest.mark.parametrize("sharding", ["table_wise", "row_wise"])
def test_torchrec_sharding_harness_passes_on_key_value_tables(sharding: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    run = subprocess.run([sys.executable, HARNESS, "key_value", sharding], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0 and "\nOK" in run.stderr, run.stderr[-4000:]

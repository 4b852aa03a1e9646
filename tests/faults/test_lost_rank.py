"""A rank killed with SIGKILL in the middle of collectives: every other rank stops within the collective timeout with a
``RankLostError`` naming it (real gloo process groups, real processes, no torchrun: nothing else stops them).

The store lives in the test process, as torchrun's agent hosts it, so any rank (rank 0 included) can be the victim.
"""

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

WORKER = Path(__file__).with_name("lost_rank_worker.py")
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 6  # the collective timeout of the job: ranks not talking to the victim wait this long


def run_job(world_size: int, victim: int):
    # The job's store lives here, as torchrun's agent hosts it (else rank 0 does, and it goes when rank 0 ends).
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "WORLD_SIZE": str(world_size),
           "TORCHELASTIC_USE_AGENT_STORE": "True",
           "VICTIM": str(victim), "TORCHREC_ASCEND_COLLECTIVE_TIMEOUT_S": str(TIMEOUT_S),
           "OMP_NUM_THREADS": "1", "TORCHREC_ASCEND_AUTOLOAD": "0"}
    procs = [subprocess.Popen([sys.executable, str(WORKER)], env={**env, "RANK": str(r)}, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world_size)]
    outputs = [p.communicate(timeout=120) for p in procs]
    return [p.returncode for p in procs], [err for _, err in outputs]


@pytest.mark.parametrize("world_size", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_survivors_name_the_killed_rank_within_the_timeout(world_size):
    victim = random.Random(world_size).randrange(world_size)
    started = time.monotonic()
    codes, errors = run_job(world_size, victim)
    assert codes[victim] == -9
    for rank in set(range(world_size)) - {victim}:
        assert codes[rank] == 1, errors[rank][-3000:]
        assert f"RankLostError: rank {victim} of {world_size} lost" in errors[rank], errors[rank][-3000:]
        assert f"while rank {rank} was all-reduce" in errors[rank]
        failed = float(errors[rank].rsplit("failed after ", 1)[1].split(" s")[0])
        reported = float(errors[rank].rsplit("reported after ", 1)[1].split(" s")[0])
        assert failed < TIMEOUT_S + 5  # the victim dies at ~0.3 s: no survivor waited past the collective timeout
        assert reported - failed < 5  # naming it costs the heartbeat window (2 s), not another timeout
    assert time.monotonic() - started < 60  # start-up included

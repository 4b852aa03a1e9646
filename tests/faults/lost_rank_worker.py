"""One rank of a bare gloo job that all-reduces in a loop; rank ``victim`` kills itself (SIGKILL) at iteration 5.

The survivors must stop with a ``RankLostError`` naming the victim (printed to stderr, exit status 1) within the
collective timeout. Environment: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``VICTIM``,
``TORCHREC_ASCEND_COLLECTIVE_TIMEOUT_S``.
"""

import os
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist

from torchrec_ascend.shutdown import RankWatch, abort_rank, collective_timeout

if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=collective_timeout())
    watch = RankWatch()
    rank, victim = dist.get_rank(), int(os.environ["VICTIM"])
    started = time.monotonic()
    for i in range(10_000):
        if i == 5 and rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(torch.ones(1000))
        except Exception as err:
            failed = time.monotonic()
            try:
                watch.check(err, f"all-reduce {i}")
                print("no rank lost", file=sys.stderr)
            except Exception:
                traceback.print_exc()
            print(f"failed after {failed - started:.1f} s, reported after {time.monotonic() - started:.1f} s",
                  file=sys.stderr)
            abort_rank(1)
        time.sleep(0.05)
    abort_rank(0)

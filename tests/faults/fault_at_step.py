"""Run a training script and send this rank a real signal after its N-th training step (a seeded fault).

``TORCHREC_ASCEND_TEST_FAULTS`` lists faults as ``attempt:signal:rank:step`` separated by commas: in torchrun
attempt ``attempt`` (``TORCHELASTIC_RESTART_COUNT``), rank ``rank`` sends itself ``SIG<signal>`` (``TERM``,
``KILL``) right after its ``step``-th successful ``HybridTrainPipelineSparseDist.progress`` of that attempt. The
signal is the real one (``os.kill``): only its timing is chosen, so a test can pick a random step from a seed.

Usage (also as a torchrun target)::

    TORCHREC_ASCEND_TEST_FAULTS=0:TERM:1:17 python tests/faults/fault_at_step.py SCRIPT ARGS...
"""

import os
import runpy
import signal
import sys

from torchrec_ascend.pipeline.hybrid import HybridTrainPipelineSparseDist

FAULTS_ENV = "TORCHREC_ASCEND_TEST_FAULTS"


def my_faults() -> dict:
    """{step: signal} for this rank in this attempt."""
    attempt, rank = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), os.environ.get("RANK", "0")
    faults = {}
    for fault in filter(None, os.environ.get(FAULTS_ENV, "").split(",")):
        at, name, on_rank, step = fault.split(":")
        if at == attempt and on_rank == rank:
            faults[int(step)] = getattr(signal, f"SIG{name}")
    return faults


def install(faults: dict) -> None:
    progress = HybridTrainPipelineSparseDist.progress
    done = [0]

    def counted(self, dataloader_iter):
        output = progress(self, dataloader_iter)
        done[0] += 1
        if done[0] in faults:
            os.kill(os.getpid(), faults[done[0]])
        return output

    HybridTrainPipelineSparseDist.progress = counted


if __name__ == "__main__":
    install(my_faults())
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")

"""Ending a distributed rank without the interpreter-shutdown abort.

With gloo, torch's communication threads can outlive ``destroy_process_group()``; the interpreter's finalization
then aborts the process ("terminate called without an active exception", exit status -6) after the work is done,
and torchrun reports the job as failed. A rank whose results are written ends here instead.

Example::

    dist.barrier()          # no rank tears down its connections while another still talks to it
    end_rank()              # destroys the process groups, flushes, exits 0
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import torch.distributed as dist


def end_rank(code: int = 0) -> NoReturn:
    """Destroy every process group, flush stdout and stderr, and end the process with ``code`` (no finalizers)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

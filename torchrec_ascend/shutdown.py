"""Ending a distributed rank: on purpose, on SIGTERM (preemption), and when another rank is lost.

* :func:`end_rank`: with gloo, torch's communication threads can outlive ``destroy_process_group()``; the
  interpreter's finalization then aborts the process ("terminate called without an active exception", exit status
  -6) after the work is done, and torchrun reports the job as failed. A rank whose results are written ends here.
* :class:`StopRequest`: SIGTERM only sets a flag; the ranks all-reduce it at every step boundary, so they all stop
  after the same step (one rank getting the signal cannot leave another waiting in a collective), save, and end
  with :data:`RESTARTABLE_EXIT`, which torchrun (``--max-restarts``) and schedulers restart.
* :class:`RankWatch`: every rank bumps a counter in the job's TCP store a few times a second. When a collective
  fails, the ranks whose counter stopped are the lost ones (a ``kill -9`` closes their sockets: gloo fails at once
  on their direct peers, at ``collective_timeout()`` elsewhere), and :meth:`RankWatch.check` names them.

Example::

    dist.init_process_group("gloo", timeout=collective_timeout())
    stop, watch = StopRequest(), RankWatch()
    try:
        for step, batch in enumerate(batches):
            train(batch)
            if stop.agreed():                    # collective: every rank calls it after every step
                save(step)
                end_rank(RESTARTABLE_EXIT)
    except Exception as err:
        watch.check(err, "training")             # RankLostError naming the lost ranks, if any
        raise
    dist.barrier()          # no rank tears down its connections while another still talks to it
    end_rank()              # destroys the process groups, flushes, exits 0
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any, Dict, List, NoReturn, Optional, Tuple

import torch
import torch.distributed as dist

from torchrec_ascend.errors import RankLostError

#: 128 + SIGTERM: the status of a process ended by SIGTERM. torchrun restarts a job whose rank exits non-zero (with
#: ``--max-restarts``); 0 would tell it the job is done.
RESTARTABLE_EXIT = 128 + signal.SIGTERM
#: Environment variable: seconds a rank waits in a collective for a rank that does not answer (default 120).
COLLECTIVE_TIMEOUT_ENV = "TORCHREC_ASCEND_COLLECTIVE_TIMEOUT_S"


def end_rank(code: int = 0) -> NoReturn:
    """Destroy every process group, flush stdout and stderr, and end the process with ``code`` (no finalizers)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    abort_rank(code)


def abort_rank(code: int) -> NoReturn:
    """End the process with ``code`` without touching the process groups (a peer may be gone: no teardown)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def collective_timeout() -> datetime.timedelta:
    """The process-group timeout: ``$TORCHREC_ASCEND_COLLECTIVE_TIMEOUT_S`` seconds, 120 by default.

    Example::

        dist.init_process_group("gloo", timeout=collective_timeout())
    """
    return datetime.timedelta(seconds=float(os.environ.get(COLLECTIVE_TIMEOUT_ENV, "120")))


class StopRequest:
    """SIGTERM as a stop that every rank takes after the same step.

    The handler only sets a flag; :meth:`agreed` all-reduces it (max) over a gloo group of its own, so the ranks
    agree even when only one got the signal, and the model's collectives (any backend) are never interleaved with
    it. Construct it on every rank, in the same order relative to other ``new_group`` calls.

    Args:
        signals: the signals taken as a stop request (default SIGTERM).

    Example::

        stop = StopRequest()
        ...
        if stop.agreed():     # after every step, on every rank
            save_and_exit()
    """

    def __init__(self, signals: Tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> None:
        self.requested = False  # set by this process's signal handler
        self._group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._previous: Dict[int, Any] = {sig: signal.signal(sig, self._handle) for sig in signals}

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        self.requested = True

    def agreed(self) -> bool:
        """Whether any rank was asked to stop (collective: every rank calls it at the same step)."""
        if self._group is None:
            return self.requested
        flag = torch.tensor([int(self.requested)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        self.requested = bool(flag.item())
        return self.requested

    def close(self) -> None:
        """Give the signals their previous handlers back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class RankWatch:
    """Heartbeats of every rank in the job's TCP store, to name the ranks lost when a collective fails.

    Each rank's daemon thread adds 1 to its counter every ``period`` seconds through a client of its own to the store
    at ``MASTER_ADDR:MASTER_PORT`` (torchrun's agent hosts it, so it outlives any rank; started without torchrun,
    rank 0 hosts it). :meth:`lost_ranks` reads the counters twice, ``window`` seconds apart.

    Args:
        period: seconds between heartbeats.
        window: seconds a lost rank's counter must stand still (several periods: a busy host delays a thread).

    Example::

        watch = RankWatch()
        try:
            train()
        except Exception as err:
            watch.check(err, "training step 37")
            raise
    """

    def __init__(self, period: float = 0.2, window: float = 2.0) -> None:
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.window = window
        self._store: Optional[Any] = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        if self.world_size > 1 and "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            self._address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
            client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                   timeout=datetime.timedelta(seconds=5))
            # A restarted job (torchrun counts restarts) gets counters of its own.
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            self._store = dist.PrefixStore(f"torchrec_ascend/heartbeat/{attempt}/", client)
            threading.Thread(target=self._beat, args=(period,), name="rank-heartbeat", daemon=True).start()

    def _key(self, rank: int) -> str:
        return f"rank{rank}"

    def _beat(self, period: float) -> None:
        while not self._stopped.is_set():
            try:
                with self._lock:
                    self._store.add(self._key(self.rank), 1)  # type: ignore[union-attr]  # set when started
            except Exception:  # the store is gone: lost_ranks() reports it
                return
            self._stopped.wait(period)

    def _counters(self) -> List[int]:
        with self._lock:
            return [self._store.add(self._key(r), 0) for r in range(self.world_size)]  # type: ignore[union-attr]

    def lost_ranks(self) -> List[int]:
        """The ranks whose heartbeat stood still for ``window`` seconds (waits that long; [] on a single rank).

        Raises:
            RankLostError: the store cannot be reached (its host is gone: rank 0 when not started by torchrun).
        """
        if self._store is None:
            return []
        try:
            before = self._counters()
            time.sleep(self.window)
            after = self._counters()
            # A rank that stopped after naming a lost one said so first: it is not lost (its exit fails its peers).
            stopped = [r for r in range(self.world_size) if after[r] == before[r] and self._get(f"stopped{r}")]
        except Exception as err:
            raise RankLostError(
                f"rank {self.rank}: the job's store at {self._address} cannot be reached ({err}); the process hosting "
                "it is gone (rank 0 when the job was not started by torchrun)"
            ) from err
        return [r for r in range(self.world_size) if r != self.rank and after[r] == before[r] and r not in stopped]

    def _get(self, key: str) -> int:
        with self._lock:
            return self._store.add(key, 0)  # type: ignore[union-attr]  # set when started

    def check(self, err: BaseException, doing: str) -> None:
        """After ``err`` (a failed collective, or any error), raise :class:`RankLostError` if a rank is lost.

        Args:
            err: the error this rank got.
            doing: what this rank was doing (for the message), e.g. ``"training step 37"``.

        Raises:
            RankLostError: ranks are lost; names them, this rank and ``err``.
        """
        lost = self.lost_ranks()
        if lost:
            with self._lock:
                self._store.add(f"stopped{self.rank}", 1)  # type: ignore[union-attr]  # lost ranks: it is set
            raise RankLostError(
                f"rank {lost[0] if len(lost) == 1 else lost} of {self.world_size} lost: no heartbeat for "
                f"{self.window:.1f} s (it ended or was killed, or its host is down) while rank {self.rank} was "
                f"{doing}, which failed with {type(err).__name__}: {str(err).strip()[:300]}. Rank {self.rank} stops "
                "too; restart the job (torchrun --max-restarts N restarts it by itself) to resume from its last "
                "complete checkpoint"
            ) from err

    def close(self) -> None:
        """Stop this rank's heartbeat."""
        self._stopped.set()

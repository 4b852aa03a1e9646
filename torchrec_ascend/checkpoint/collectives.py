"""The few collectives a checkpoint needs, with one rule: a failure on any rank fails the call on every rank.

A save or load is a sequence of local steps separated by agreement points. If one rank raises and the others carry
on into the next collective, they hang until the process group times out; :meth:`Group.agree` instead tells every
rank what happened: the failing rank re-raises its own exception, the others raise :class:`StorageError` naming
it. Objects exchanged are our own small Python values (versions, layouts, metadata entries), never file contents.
Without a process group (or with one rank) every call is local.

Example::

    group = Group(None)            # the default process group if initialised, else this process alone
    version = group.from_rank0(lambda: begin_save(path))
    group.agree("writing the data file", error)
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, TypeVar

import torch.distributed as dist

from torchrec_ascend.errors import StorageError

T = TypeVar("T")


class Group:
    """A process group (or none) seen as rank, size and a few failure-aware collectives.

    Args:
        process_group: the group whose ranks take part; None means the default group when torch.distributed is
            initialised, else this process alone.

    Example::

        group = Group(None)
        sizes = group.all_gather(len(shards))   # one per rank, on every rank
    """

    def __init__(self, process_group: Optional[Any]) -> None:
        if process_group is None and dist.is_available() and dist.is_initialized():
            process_group = dist.group.WORLD
        self.process_group: Any = process_group
        self.rank = dist.get_rank(process_group) if process_group is not None else 0
        self.size = dist.get_world_size(process_group) if process_group is not None else 1

    def all_gather(self, value: Any) -> List[Any]:
        """Every rank's ``value``, in rank order."""
        if self.size == 1:
            return [value]
        out: List[Any] = [None] * self.size
        dist.all_gather_object(out, value, group=self.process_group)
        return out

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        if self.size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.process_group, 0), group=self.process_group)
        return box[0]

    def agree(self, what: str, error: Optional[BaseException]) -> None:
        """Every rank learns whether any rank failed ``what``; if one did, every rank raises.

        Raises:
            BaseException: this rank's own ``error``.
            StorageError: another rank failed (the message names the ranks and their errors).
        """
        failures = self.all_gather(None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        failed = [(rank, text) for rank, text in enumerate(failures) if text is not None]
        if failed:
            detail = "; ".join(f"rank {rank}: {text}" for rank, text in failed)
            raise StorageError(f"checkpoint {what} failed on another rank: {detail}")

    def from_rank0(self, what: str, compute: Callable[[], T]) -> T:
        """``compute()`` run on rank 0 only, its result on every rank (an exception there fails every rank)."""
        value: Any = None
        error: Optional[BaseException] = None
        if self.rank == 0:
            try:
                value = compute()
            except Exception as err:  # every rank must learn of it before raising
                error = err
        self.agree(what, error)
        return self.broadcast(value)

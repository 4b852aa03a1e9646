"""A hash kernel's ID mapper: its batches' raw IDs to pool rows, now or ahead of the lookup (prefetch), with pins.

The mapper owns the order in which batches take rows: a prefetching pipeline maps a batch on its host thread ahead
of the batch's lookup, and the rows of every batch in flight stay pinned (never evicted) until the lookup after its
own; one lock serialises the two threads. Mapping a batch (:meth:`IdMapper.map_on_host`) checks its IDs on the host
copy, asks each table's slot table for rows, hands arriving and evicted rows to the kernel's row tier and rewrites
the pool's default rows. The batch's IDs cross to the host once and its rows come back once (the mapper's two
copies, through :mod:`torchrec_ascend.kernels.transfers`).

Example::

    mapper = IdMapper(slot_tables, ["f1", "f2"], [0, 0], pool, PoolOnly(pool), training=lambda: kernel.training)
    mapper.prefetch(indices, offsets)     # the pipeline, ahead of the batch
    rows = mapper.lookup(features)        # the forward: the prefetched rows, or mapped now
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.errors import check_non_negative_ids
from torchrec_ascend.hash.slot_table import Assignment, SlotTable
from torchrec_ascend.kernels.pool import Pool
from torchrec_ascend.kernels.row_tier import RowTier
from torchrec_ascend.kernels.transfers import to_device, to_host

_EMPTY = torch.empty(0, dtype=torch.int64)


def with_values(features: KeyedJaggedTensor, values: torch.Tensor) -> KeyedJaggedTensor:
    """``features`` with ``values`` replaced (same keys, lengths, weights and variable-batch layout); ``features``
    itself when ``values`` are its own (a host batch on the CPU: building a KJT costs ~20 us)."""
    if values is features.values():
        return features
    return KeyedJaggedTensor(
        keys=features.keys(),
        values=values,
        weights=features.weights_or_none(),
        lengths=features.lengths(),
        offsets=features.offsets(),
        stride_per_key_per_rank=features.stride_per_key_per_rank() if features.variable_stride_per_key() else None,
        stride=None if features.variable_stride_per_key() else features.stride(),
        length_per_key=features.length_per_key(),
        offset_per_key=features.offset_per_key(),
    )



def _joined(parts: List[torch.Tensor], empty: torch.Tensor) -> torch.Tensor:
    """``parts`` concatenated (``empty`` if none); a single part as it is, without a copy (one table's IDs mostly
    come from one feature)."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat(parts) if parts else empty


def _same_tensor_data(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``b`` views exactly ``a``'s elements, unchanged, without reading them (no host sync on a device).

    Sound while ``a`` is alive: its memory cannot go to another tensor, so an equal address, layout and dtype is
    the same memory, and the version counter (shared by every view of a storage) says nothing wrote it since.
    """
    return (a is b) or (
        a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        and a._version == b._version
    )


def handed_to_this_stream(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, made on another stream (a prefetch lane's), recorded on the current one, which reads it and then
    drops it: without the record the allocator could hand its memory to that stream's next allocation under this
    stream's pending reads (the emulated npu's stream check found it)."""
    if _has_streams(tensor.device):
        tensor.record_stream(torch.accelerator.current_stream(tensor.device))
    return tensor


def _has_streams(device: torch.device) -> bool:
    """Whether ``device`` is the accelerator (work on it runs on streams)."""
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return accelerator is not None and accelerator.type == device.type


@dataclasses.dataclass
class Pins:
    """A batch's pinned slots per table, and per table whether it read the reserved row."""

    slots: List[torch.Tensor]
    default_used: List[bool]


class IdMapper:
    """Raw IDs -> pool rows for one kernel, with prefetch and pins.

    Args:
        slot_tables: the kernel's slot tables, one per table.
        feature_names: the kernel's features, in its (TorchRec's feature-major) order.
        feature_table_map: per feature, its table's index.
        pool: the kernel's pool (its default rows; the tier fills arriving rows in it).
        tier: the kernel's row tier (rows arriving in the pool and leaving it).
        training: whether the kernel trains now (slot tables insert only in training).
        on_batch: called with each batch's host copy before it is mapped: the kernel's further checks (raise to
            refuse the batch) and per-batch bookkeeping.
    """

    def __init__(
        self,
        slot_tables: Sequence[SlotTable],
        feature_names: List[str],
        feature_table_map: List[int],
        pool: Pool,
        tier: RowTier,
        training: Callable[[], bool],
        on_batch: Optional[Callable[[KeyedJaggedTensor], None]] = None,
    ) -> None:
        self._slot_tables = slot_tables
        self._feature_names = feature_names
        self._features_of = [[i for i, ft in enumerate(feature_table_map) if ft == t] for t in range(len(slot_tables))]
        self._table_name = {f: pool.names[t] for f, t in zip(feature_names, feature_table_map)}
        self._pool = pool
        self._tier = tier
        self._training = training
        self._on_batch = on_batch
        self._pipeline_depth = 1
        # Prefetched batches by their IDs tensor (kept alive, so its address stays unique): (ids, rows, pinned slots);
        # rows and pins None: the batch could not be prefetched and is mapped at its lookup (and so is every later one).
        self._prefetched: "collections.OrderedDict[Tuple[int, int], Tuple[Any, Any, Any]]" = collections.OrderedDict()
        # The batch between its lookup and the next: its pinned slots, and per table whether it read the reserved row
        # (its backward may move that row; the next lookup writes it back). At first every reserved row is written.
        self._in_compute = Pins([], [True] * len(slot_tables))
        self._default_read = [True] * len(slot_tables)  # the same, per table, for the last batch map_now mapped
        self._prefetching = False  # set by the first prefetch: from then on lookups pin their batch's rows
        self._rows_lock = threading.Lock()  # prefetch (a host thread) and lookup (the compute thread) both map IDs
        # Recorded on the compute stream by each pipelined lookup, after the rows it released and wrote: a prefetch
        # on another stream waits for it before it may evict (read) those rows (found by the emulated npu's stream
        # check: the previous batch's optimizer update could still be in flight).
        self._released: Optional[Any] = None
        self.prefetched_batches = 0  # lookups that found their rows ready

    def set_pipeline_depth(self, depth: int) -> None:
        """Accept any depth: pins follow the batches actually in flight (see :meth:`prefetch`)."""
        self._pipeline_depth = max(1, int(depth))

    def prefetch(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        forward_stream: Any = None,
        batch_size_per_feature_per_rank: Any = None,
    ) -> None:
        """TorchRec's prefetch: choose this batch's rows now (KEY_VALUE: swap them in), ahead of its lookup.

        Called in batch order with the group's raw IDs (TorchRec's feature-major TBE layout). The batch's rows stay
        pinned until the lookup after its own (by then its backward is done), so a later batch never evicts a row a
        batch in flight uses: the protection window is exactly the batches in flight, whatever the pipeline depth.
        If the cache cannot hold one more batch's rows next to the pinned ones, this batch (and the ones after it,
        keeping the order) are mapped at their lookup instead; results are identical either way.
        """
        if batch_size_per_feature_per_rank is not None or not self._feature_names:
            return  # variable batch sizes: rows are chosen in the lookup
        # The batch's IDs and offsets cross to the host once (this runs on the pipeline's host thread).
        on_host = KeyedJaggedTensor(keys=self._feature_names, values=to_host(indices), offsets=to_host(offsets))
        self._prefetching = True
        key = (indices.data_ptr(), indices.numel())
        with self._rows_lock:
            waiting = any(rows is None for _, rows, _ in self._prefetched.values())
            if waiting or not self.fits(on_host):
                self._prefetched[key] = (indices, None, None)  # later batches must not take rows this one needs first
            else:
                self._wait_for_pool_writes(indices.device, forward_stream)
                rows, assignments = self.map_on_host(on_host, indices.device)
                self._prefetched[key] = (indices, rows, self._pin(assignments))
            while len(self._prefetched) > self._pipeline_depth + 1:  # batches a pipeline dropped (detach, end)
                pinned = self._prefetched.popitem(last=False)[1][2]
                if pinned is not None:
                    self._release(pinned)

    def _wait_for_pool_writes(self, device: torch.device, forward_stream: Any) -> None:
        """Order this (prefetch) stream after the pool's writes on the compute stream before it evicts and swaps in:
        those up to the last lookup (the rows it released, the previous batch's update), or before any lookup all of
        ``forward_stream``'s (the pool's first rows; the emulated npu's stream check caught stock
        PrefetchTrainPipelineSparseDist's first prefetch writing beside them)."""
        if self._released is not None:
            torch.accelerator.current_stream(device).wait_event(self._released)
        elif forward_stream is not None:
            torch.accelerator.current_stream(device).wait_stream(forward_stream)

    def lookup(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``features`` with raw IDs replaced by rows: the prefetched ones, or chosen now."""
        if not self._prefetching:  # no pipeline prefetches this kernel: nothing is in flight to pin against
            return self.map_now(features)
        values = features.values()
        with self._rows_lock:
            done, self._in_compute = self._in_compute, Pins([], [])
            self._release(done)  # the previous batch's backward is done: its rows may go
            ready = self._prefetched.pop((values.data_ptr(), values.numel()), None)
            self._rewrite_default_rows(done.default_used)
            if ready is not None and ready[1] is not None and _same_tensor_data(ready[0], values):
                self.prefetched_batches += 1
                mapped, self._in_compute = with_values(features, handed_to_this_stream(ready[1])), ready[2]
            else:
                if ready is not None and ready[2] is not None:
                    self._release(ready[2])
                rows, assignments = self.map_on_host(with_values(features, to_host(values)), values.device)
                mapped = with_values(features, rows)
                self._in_compute = self._pin(assignments)
            if _has_streams(values.device):
                self._released = torch.Event(device=values.device)
                self._released.record()
            return mapped

    def map_now(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``features`` with raw IDs replaced by rows chosen now (nothing pinned); the values on their device."""
        values = features.values()
        # Outside the lookups' order (a pipeline prefetches too) any batch in flight may have read a reserved row.
        self._rewrite_default_rows([True] * len(self._slot_tables) if self._prefetching else self._default_read)
        rows, assignments = self.map_on_host(with_values(features, to_host(values)), values.device)
        self._default_read = [a.default_used for a in assignments]
        return with_values(features, rows)

    def _rewrite_default_rows(self, moved: List[bool]) -> None:
        """Rewrite the reserved row of each table whose row the previous batch read (its backward may have moved it;
        no other batch trains it) on the compute stream, before the lookup reads it. Only the compute stream writes
        it: a prefetch on a host lane would race the lookup of the batch before (the emulated npu's stream check
        caught it at pipeline depth 2 and 3). Left alone when unread, it is not written beside the lanes' writes of
        other rows of the pool, which the stream check (per allocation, not per row) would report."""
        for t, write in enumerate(moved):
            if write:
                self._pool.write_default_row(t)

    def map_on_host(self, on_host: KeyedJaggedTensor, device: torch.device) -> Tuple[torch.Tensor, List[Assignment]]:
        """Map ``on_host`` (a batch's raw IDs on the host): its rows on ``device`` (one host-to-device copy), and
        per table its slot table's assignment (rows on the host, for pinning).

        Raises:
            InputError: a negative ID (the message names its table and feature), or ``on_batch``'s refusal.
            CapacityError: a table cannot take the batch's new IDs (see :meth:`SlotTable.assign`).
        """
        values = on_host.values()
        check_non_negative_ids(
            values, self._feature_names, lambda: on_host.offset_per_key()[1:], self._table_name.__getitem__
        )
        if self._on_batch is not None:
            self._on_batch(on_host)
        per_feature = torch.split(values, on_host.length_per_key())
        slots: List[Any] = [None] * len(per_feature)
        assignments = []
        training = self._training()
        for t, table in enumerate(self._slot_tables):
            features_of_t = self._features_of[t]
            ids = _joined([per_feature[i] for i in features_of_t], values[:0])
            assignment = table.assign(
                ids.long(), training=training,
                known=self._tier.known(t), on_evict=functools.partial(self._tier.left, t),
            )
            if assignment.new_slots.numel():
                try:
                    self._tier.arrived(t, assignment)
                except Exception:
                    table.remove(assignment.new_ids)  # unfilled rows must not stay mapped; the stores keep theirs
                    raise
            assignments.append(assignment)
            if len(features_of_t) == 1:
                slots[features_of_t[0]] = assignment.slots
            else:
                sizes = [per_feature[i].numel() for i in features_of_t]
                for i, part in zip(features_of_t, torch.split(assignment.slots, sizes)):
                    slots[i] = part
        return to_device(_joined(slots, values), device), assignments

    def fits(self, features: KeyedJaggedTensor) -> bool:
        """Whether the pools can take these (host) IDs' rows now, next to the pinned rows of batches in flight."""
        return all(t.can_fit(ids) for t, ids in zip(self._slot_tables, self.ids_per_table(features)))

    def ids_per_table(self, features: KeyedJaggedTensor) -> List[torch.Tensor]:
        """Per table, the values of its features, concatenated in feature order."""
        per_feature = torch.split(features.values(), features.length_per_key())
        return [torch.cat([per_feature[i] for i in features] or [_EMPTY]) for features in self._features_of]

    def _pin(self, assignments: List[Assignment]) -> Pins:
        """Pin a batch's rows (its assignments, one per table) until :meth:`_release`."""
        pinned = Pins([], [])
        for table, assignment in zip(self._slot_tables, assignments):
            slots = assignment.slots
            if assignment.default_used:
                slots = slots[slots != table.default_slot]
            slots = torch.unique(slots)
            table.pin(slots)
            pinned.slots.append(slots)
            pinned.default_used.append(assignment.default_used)
        return pinned

    def _release(self, pinned: Pins) -> None:
        for table, slots in zip(self._slot_tables, pinned.slots):
            table.pin(slots, -1)

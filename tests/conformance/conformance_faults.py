"""Test-only plugin that breaks one kernel on import, so the conformance suite's tests can show it fails.

It is never installed: ``test_conformance_teeth.py`` writes a throwaway distribution whose ``torchrec_ascend``
entry point names this module, and puts it on ``PYTHONPATH`` for one ``torchrec-ascend conformance`` run. The
plugin manager imports it in every process of that run (before TorchRec's first module loads), and
``TORCHREC_ASCEND_TEST_FAULT`` picks the fault:

* ``bucketize_off_by_one``: row-wise bucketization uses blocks one row too large, so each block's last ID lands on
  the wrong rank (and row).
* ``drop_update``: the second training forward of every fused TBE is cut off from autograd, so that step's fused
  optimizer update never happens.

Faults in torchrec-ascend's own parts:

* ``hash_bucketizer``: every other batch, the row-wise input dist buckets IDs by the hash of ``ID + 1``, so an ID
  reaches different ranks on different steps (and gets a row on each).
* ``eviction_ids``: the slot table reports evicted rows with their IDs rotated by one, so KEY_VALUE writes each
  evicted row back under another ID.
* ``kv_optimizer_state``: KEY_VALUE writes evicted rows back without their optimizer state (zeroed), so a row
  swapped back in restarts its optimizer.
* ``saver_row``: the Saver's export of a shard's cached rows leaves out the last one.
* ``dedup_reverse``: index dedup's reverse indices point one distinct ID further (wrapping), so embeddings come
  back for the wrong IDs.
* ``transfer_dropped``: the hash kernels hand the TBE the batch's rows on the host, not on the kernel's device
  (the host-to-device copy is dropped): harmless on the CPU, an error on any other device.
* ``fresh_state_fused``: a FUSED pool gives a row handed to a new ID its initial value but keeps the optimizer state
  of the ID that held it before.
* ``fresh_state_key_value``: the KEY_VALUE tier does the same for a new ID arriving in a cache row (the state of
  the row's previous ID stays).
* ``pins_kept``: the ID mapper never releases the pins of the batch in compute (its lookup forgets them instead
  of releasing them when the next batch's lookup comes).
* ``saver_removed``: an incremental save records no IDs that left a shard since the previous save.
* ``kv_state_dict_placeholder``: KEY_VALUE tables' stock ``state_dict()`` entries are TorchRec's placeholders again
  (zeros of the table's shape, no ``weight_id``): their rows are not in a DCP checkpoint.
* ``policy_state_dropped``: a hash table's loaded ``policy_state`` is never applied (DCP loads restore rows only;
  caches and policies start over).
* ``double_policy_step``: a hash table's slot table takes two policy steps per training batch (as one stepping
  once per feature of a two-feature table would).
* ``young_not_protected``: the eviction cadence picks victims by the policy's order alone (``min_residency`` no
  longer protects young rows).
* ``cadence_every_step``: every step is a bulk-eviction step (``interval`` ignored): expired rows and the headroom
  go at every batch.
* ``hash_sharding_unchecked``: hash tables accept table_row_wise like the sharding types they support (the planner
  may propose it, a hand-written plan is not refused).
* ``whole_shard_short``: a KEY_VALUE cache of ``CacheParams(load_factor=1.0)`` is sized as one of 1/16 (fewer rows
  than the distinct IDs the check's traffic brings to a shard), so it evicts.
* ``not_admitted_row_trained``: the ID mapper writes each table's reserved row (the vector rejected IDs read) at its
  first lookup only, so the gradients of rejected IDs train it and later rejected IDs read a trained row.
* ``init_from_slot``: a FUSED pool initialises a new row from its slot (the order IDs arrived in), not from its ID.

Faults of the documented bad-input errors (the errors check):

* ``full_table_silent``: a full table with ``overflow="error"`` raises nothing: the batch reads the reserved row.
* ``negative_id_unchecked``: the sharded kernels' ID mapper no longer checks IDs, so a negative one reaches the
  native ID map, whose error names neither the table nor the feature.
* ``small_cache_silent``: a KEY_VALUE batch with more distinct rows than the cache holds is not refused: the cache
  makes what room it can and the new IDs that find no row read the reserved one.
* ``policy_no_suggestion``: an unknown policy name or option is refused without the closest name.
* ``path_escape_accepted``: a checkpoint's metadata may name a file outside its folder (``../elsewhere/...``): the
  name is joined as it is.
* ``disk_checksum_partial``: the KEY_VALUE disk tier's record checksum covers the key and the location but not the
  row's bytes, so flipped row bytes are read back as they are.

Faults only the emulated NPU's stream-order check sees (work there runs synchronously on the host, so the numbers
stay right; on hardware they would not):

* ``stage_wait_missing``: the pipeline's stage hand-over records the batch on the next stage's stream but no longer
  makes that stream wait for the previous stage's event.
* ``record_stream_missing``: the hand-over waits but no longer calls ``record_stream``, so a batch freed after
  compute returns to its copy stream's allocator while compute may still use it.
* ``host_read_in_flight``: the row-wise hash input dist copies the batch's IDs to the host with
  ``non_blocking=True`` and reads them without waiting for the copy.

Faults only the emulated NPU's device memory sees:

* ``cache_past_memory``: the KEY_VALUE kernel sizes its device cache at 16,384 times the rows the plan gave it
  (the planner's estimate stays right, so the plan is accepted): run with ``--emulate-memory`` below that cache, the
  first table's TBE allocation fails with torch_npu's "NPU out of memory".

A fault the emulated NPU's copy and sync counters see:

* ``item_per_step``: the FUSED hash EBC kernel reads a number off its output with ``.item()`` on every training
  forward (a per-step host sync on the compute thread); the kernel's sync budget (``harness.TRANSFER_BUDGET``,
  1 per call) fails the case.

Faults of the KEY_VALUE kernel behind the hybrid pipeline (its compute-thread budget case):

* ``prefetch_check_syncs``: the ID mapper checks that a lookup's IDs are the prefetched batch's by comparing them
  on the device (``torch.equal``: a host sync per lookup on the compute thread) instead of by address and version.
* ``prefetched_rows_unrecorded``: the rows a prefetch mapped are not recorded on the compute stream that reads and
  drops them (``handed_to_this_stream`` does nothing).

A fault of the FUSED hash kernel behind the hybrid pipeline (its compute-budget case):

* ``fused_not_prefetched``: sharded lookups prefetch only cached kernels again (stock TorchRec's rule), so FUSED hash
  tables map their IDs on the compute thread (``hooks/hash_tables.py``'s prefetch patch finds no FUSED kernel).

Faults of cases full runs hold (the checkpoint check's refused loads and dense path, stock pipelines, catalogue rows,
stock state_dict round trips):

* ``load_not_agreed``: a rank learns only of its own failure in a Saver load (``Group.agree`` gathers nothing), so
  the other ranks restore their tables.
* ``ids_twice_accepted``: a KEY_VALUE load's IDs are not checked for repeats.
* ``first_prefetch_unordered``: a prefetch before any lookup waits for nothing on the compute stream, so stock
  PrefetchTrainPipelineSparseDist's first swap-in writes beside the pool's first rows (emulated NPU only).
* ``adam_betas_unchecked``: fused ADAM's ``beta1`` and ``beta2`` are not range-checked at sharding.
* ``cache_estimate_zero``: the planner's estimate of a KEY_VALUE shard's device cache and swap staging is 0 bytes
  (TorchRec's own figure), so a plan whose caches do not fit ``hbm_cap`` is accepted.
* ``weight_ids_ignored``: loading a stock ``state_dict()`` takes each FUSED hash table's ``weight_id`` out and
  restores no ID (the rows come back without their IDs).
* ``reserved_row_shown``: the fused optimizer is not rebuilt on the hidden config, so its state (and
  ``fused_optimizer.state_dict()``) still covers each table's reserved row.
* ``dense_drops_plain``: ``dense_state_dict`` leaves out every table, plain FUSED tables too (not only the Saver's).

``TORCHREC_ASCEND_TEST_FAULT`` may name several faults, comma-separated (of different modules).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Any, Callable

import torch

FAULT_ENV = "TORCHREC_ASCEND_TEST_FAULT"


def _bucketize_off_by_one() -> None:
    import fbgemm_gpu  # noqa: F401  (registers the fbgemm ops)

    original = torch.ops.fbgemm.block_bucketize_sparse_features

    def off_by_one(*args: Any, **kwargs: Any) -> Any:
        kwargs["block_sizes"] = kwargs["block_sizes"] + 1
        return original(*args, **kwargs)

    torch.ops.fbgemm.block_bucketize_sparse_features = off_by_one


def _drop_update() -> None:
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen

    original = SplitTableBatchedEmbeddingBagsCodegen.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if not (self.training and torch.is_grad_enabled()):
            return out
        self.fault_calls = getattr(self, "fault_calls", 0) + 1
        return out.detach().requires_grad_() if self.fault_calls == 2 else out

    SplitTableBatchedEmbeddingBagsCodegen.forward = forward


def _after_import(name: str, patch: Callable[[], None]) -> Callable[[], None]:
    """A fault that patches module ``name`` once it is imported (plugins load while TorchRec is half imported)."""

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            run = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                patch()

            spec.loader.exec_module = exec_module
            return spec

    def install() -> None:
        if name in sys.modules:
            patch()
        else:
            sys.meta_path.insert(0, Finder())

    return install


def _hash_bucketizer() -> None:
    from torchrec_ascend.native import ops

    original, calls = ops.hash_bucketize, [0]

    def shifted(lengths: Any, values: Any, weights: Any, world_size: int) -> Any:
        calls[0] += 1
        if calls[0] % 2:
            return original(lengths, values, weights, world_size)
        out_lengths, bucketed, out_weights, permute = original(lengths, values + 1, weights, world_size)
        return out_lengths, bucketed - 1, out_weights, permute

    ops.hash_bucketize = shifted


def _eviction_ids_patch() -> None:
    from torchrec_ascend.hash.slot_table import SlotTable

    original = SlotTable.assign

    def assign(
        self: Any, ids: Any, training: bool, known: Any = None, signals: Any = None, on_evict: Any = None
    ) -> Any:
        rotated = None if on_evict is None else (lambda slots, evicted: on_evict(slots, evicted.roll(1)))
        return original(self, ids, training, known=known, signals=signals, on_evict=rotated)

    SlotTable.assign = assign


def _kv_optimizer_state_patch() -> None:
    from torchrec_ascend.kernels.key_value.tier import HostDiskTier

    def left(self: Any, t: int, slots: Any, ids: Any) -> None:
        rows = self._pool.pack(t, slots)
        rows[:, self._pool.cols(t):] = 0.0
        self.stores[t].put(ids, rows)
        self.swaps[t]["swapped_out"] += ids.numel()

    HostDiskTier.left = left


def _saver_row_patch() -> None:
    import itertools

    from torchrec_ascend.kernels.fused import HashRows, ShardRows

    original = HashRows.export_shard

    def export_shard(self: Any, t: int, changed_only: bool = False) -> Any:
        blocks, removed = original(self, t, changed_only)
        pool = next(blocks)
        cut = ShardRows(pool.ids[:-1], pool.slots[:-1], pool.last_used[:-1], pool.rows[:-1])
        return itertools.chain([cut], blocks), removed

    HashRows.export_shard = export_shard


def _dedup_reverse_patch() -> None:
    from torchrec_ascend.sharders import index_dedup

    original = index_dedup.dedup_per_table

    def dedup_per_table(features: Any, groups: Any, accumulate_weights: bool = False) -> Any:
        deduped, reverse = original(features, groups, accumulate_weights)
        n = deduped.values().numel()
        return deduped, (reverse + 1) % max(n, 1)

    index_dedup.dedup_per_table = dedup_per_table


def _transfer_dropped_patch() -> None:
    from torchrec_ascend.kernels.id_mapper import IdMapper

    original = IdMapper.map_on_host

    def map_on_host(self: Any, on_host: Any, device: Any) -> Any:
        rows, mapped = original(self, on_host, device)
        return mapped.values(), mapped  # the rows stay on the host

    IdMapper.map_on_host = map_on_host


def _fresh_state_fused_patch() -> None:
    from torchrec_ascend.kernels.pool import Pool

    def initialise(self: Any, t: int, assignment: Any) -> None:
        weights = self._tbe.weights(t)
        with torch.no_grad():  # the initial values, but the optimizer states are left as they were
            weights[assignment.new_slots.to(weights.device)] = self.initial_rows(t, assignment.new_ids).to(
                dtype=weights.dtype, device=weights.device)

    Pool.initialise = initialise


def _fresh_state_key_value_patch() -> None:
    from torchrec_ascend.kernels.key_value.tier import HostDiskTier

    original = HostDiskTier.arrived

    def arrived(self: Any, t: int, assignment: Any) -> None:
        stale = self._pool.pack(t, assignment.new_slots)  # the rows' previous IDs' weights and state
        known = self.stores[t].contains(assignment.new_ids)
        original(self, t, assignment)
        fresh = ~known
        if bool(fresh.any()):
            rows = self._pool.pack(t, assignment.new_slots)
            rows[fresh, self._pool.cols(t):] = stale[fresh, self._pool.cols(t):]
            self._pool.unpack(t, assignment.new_slots, rows)

    HostDiskTier.arrived = arrived


def _pins_kept_patch() -> None:
    from torchrec_ascend.kernels.id_mapper import IdMapper, Pins

    original = IdMapper.lookup

    def lookup(self: Any, features: Any) -> Any:
        # the previous batch's pins are forgotten, never released (whether it read the reserved row is kept)
        self._in_compute = Pins([], self._in_compute.default_used)
        return original(self, features)

    IdMapper.lookup = lookup


def _saver_removed_patch() -> None:
    from torchrec_ascend.kernels.fused import HashRows

    original = HashRows.export_shard

    def export_shard(self: Any, t: int, changed_only: bool = False) -> Any:
        blocks, removed = original(self, t, changed_only)
        return blocks, removed[:0]

    HashRows.export_shard = export_shard


def _kv_state_dict_placeholder_patch() -> None:
    from torchrec_ascend.checkpoint import key_value_state

    key_value_state.add_key_value_entries = lambda module, destination, prefix, attr: None


def _policy_state_dropped_patch() -> None:
    from torchrec_ascend.checkpoint import policy_state

    policy_state.take_loaded = lambda kernel, t: None


def _double_policy_step_patch() -> None:
    from torchrec_ascend.hash.slot_table import SlotTable

    original = SlotTable.assign

    def assign(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = self.step
        out = original(self, *args, **kwargs)
        self.step += self.step - before  # a step taken (training) is taken twice
        return out

    SlotTable.assign = assign


def _young_not_protected_patch() -> None:
    from torchrec_ascend.policies.cadence import EvictionCadence

    original = EvictionCadence.select

    def select(self: Any, policy: Any, num: int, evictable: Any, step: int) -> Any:
        self.inserted_step.fill_(-(1 << 40))  # every row as old as can be: none is young
        return original(self, policy, num, evictable, step)

    EvictionCadence.select = select


def _cadence_every_step_patch() -> None:
    from torchrec_ascend.policies.cadence import EvictionCadence

    EvictionCadence.due = lambda self, step: True


def _hash_sharding_unchecked_patch() -> None:
    from torchrec_ascend import sharders

    sharders.HASH_SHARDING_TYPES = (*sharders.HASH_SHARDING_TYPES, "table_row_wise")


def _whole_shard_short_patch() -> None:
    from torchrec_ascend.kernels.key_value import kernel

    original = kernel._cache_table

    def cache_table(table: Any, load_factor: Any) -> Any:
        if load_factor != 1.0:
            return original(table, load_factor)
        return kernel.with_block_rows(table, lambda rows: kernel.cache_rows(rows, 1 / 16))

    kernel._cache_table = cache_table


def _stage_wait_missing_patch() -> None:
    from torchrec_ascend.pipeline.streams import PipelineStreams

    def wait(self: Any, event: Any, tensors: Any = None) -> None:
        if event is not None and tensors is not None:  # the batch is recorded, but nothing waits for its event
            tensors.record_stream(self._module.current_stream())

    PipelineStreams.wait = wait


def _record_stream_missing_patch() -> None:
    from torchrec_ascend.pipeline.streams import PipelineStreams

    def wait(self: Any, event: Any, tensors: Any = None) -> None:
        if event is not None:  # waits, but the batch is not recorded on this stream
            self._module.current_stream().wait_event(event)

    PipelineStreams.wait = wait


def _host_read_in_flight_patch() -> None:
    from torchrec_ascend.sharders import hash_row_wise

    original = hash_row_wise._move

    def move(tensors: Any, device: Any, non_blocking: bool) -> Any:
        return original(tensors, device, True)  # also towards the host, whose reads then do not wait

    hash_row_wise._move = move


def _cache_past_memory_patch() -> None:
    from torchrec_ascend.kernels.key_value import kernel

    original = kernel.cache_rows

    def cache_table(table: Any, load_factor: Any) -> Any:
        return kernel.with_block_rows(table, lambda rows: original(rows, load_factor) * 16384)

    kernel._cache_table = cache_table


def _item_per_step_patch() -> None:
    from torchrec_ascend.kernels.fused import HashFusedEmbeddingBag

    original = HashFusedEmbeddingBag.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if self.training and out.numel():
            out.detach().reshape(-1)[0].item()  # e.g. a loss or norm logged every step
        return out

    HashFusedEmbeddingBag.forward = forward


def _prefetch_check_syncs_patch() -> None:
    from torchrec_ascend.kernels import id_mapper

    id_mapper._same_tensor_data = lambda a, b: a is b or torch.equal(a, b)


def _prefetched_rows_unrecorded_patch() -> None:
    from torchrec_ascend.kernels import id_mapper

    id_mapper.handed_to_this_stream = lambda tensor: tensor


def _not_admitted_row_trained_patch() -> None:
    from torchrec_ascend.kernels.id_mapper import IdMapper

    original = IdMapper._rewrite_default_rows

    def rewrite_default_rows(self: Any, moved: Any) -> None:
        if not getattr(self, "fault_default_rows_written", False):
            self.fault_default_rows_written = True
            original(self, [True] * len(moved))

    IdMapper._rewrite_default_rows = rewrite_default_rows


def _fused_not_prefetched_patch() -> None:
    from torchrec_ascend.adapters import lookups

    lookups.kernels_with_features = lambda lookup, features: iter(())


def _load_not_agreed_patch() -> None:
    from torchrec_ascend.checkpoint.collectives import Group

    def agree(self: Any, what: str, error: Any) -> None:  # a rank learns only of its own failure
        if error is not None:
            raise error

    Group.agree = agree


def _ids_twice_accepted_patch() -> None:
    from torchrec_ascend.checkpoint.key_value_state import TableView

    TableView._check_ids = lambda self, ids: None


def _first_prefetch_unordered_patch() -> None:
    from torchrec_ascend.kernels.id_mapper import IdMapper

    def wait_for_pool_writes(self: Any, device: Any, forward_stream: Any) -> None:
        if self._released is not None:  # the lookups' event only: the first prefetch waits for nothing
            torch.accelerator.current_stream(device).wait_event(self._released)

    IdMapper._wait_for_pool_writes = wait_for_pool_writes


def _full_table_silent_patch() -> None:
    from torchrec_ascend.errors import CapacityError
    from torchrec_ascend.hash.slot_table import Assignment, SlotTable

    original = SlotTable._insert_all

    def insert_all(self: Any, ids: Any) -> Any:
        try:
            return original(self, ids)
        except CapacityError:  # the batch reads the reserved row instead
            return Assignment(slots=torch.full_like(ids, self.default_slot))

    SlotTable._insert_all = insert_all


def _negative_id_unchecked_patch() -> None:
    from torchrec_ascend.kernels import id_mapper

    id_mapper.check_non_negative_ids = lambda *args, **kwargs: None


def _small_cache_silent_patch() -> None:
    from torchrec_ascend.errors import CapacityError
    from torchrec_ascend.hash.slot_table import SlotTable

    original = SlotTable._make_room

    def make_room(self: Any, needed: int, on_evict: Any) -> Any:
        try:
            return original(self, needed, on_evict)
        except CapacityError:
            if self.overflow == "error":
                raise
            # room for what fits; the rest of the batch's new IDs find no row and read the reserved one
            evictable = (self.last_used <= self.step - self.window) & (self.slot_ids >= 0) & (self.pins == 0)
            return original(self, min(needed, self.capacity - len(self.id_map) + int(evictable.sum())), on_evict)

    SlotTable._make_room = make_room


def _policy_no_suggestion_patch() -> None:
    from torchrec_ascend.policies import registry

    registry._suggest = lambda name, known: ""


def _path_escape_accepted_patch() -> None:
    import os

    from torchrec_ascend.checkpoint import files

    original = files.confined

    def confined(directory: str, name: Any, what: str) -> str:
        if isinstance(name, str) and name not in ("", ".", ".."):  # a name with separators is joined as it is
            return os.path.join(directory, name)
        return original(directory, name, what)

    files.confined = confined


def _disk_checksum_partial_patch() -> None:
    from torchrec_ascend.kernels.key_value.disk_record import RecordFormat

    original = RecordFormat.__init__

    def __init__(self: Any, width: int, dtype: Any) -> None:
        original(self, width, dtype)
        self._multipliers = self._multipliers.copy()
        self._multipliers[2:] = 0  # the checksum covers the key and the location, not the row's bytes

    RecordFormat.__init__ = __init__


def _init_from_slot_patch() -> None:
    import dataclasses

    from torchrec_ascend.kernels.pool import Pool

    original = Pool.initialise

    def initialise(self: Any, t: int, assignment: Any) -> None:
        # a new row's initial values are those of its slot (arrival order), not of its ID
        original(self, t, dataclasses.replace(assignment, new_ids=assignment.new_slots))

    Pool.initialise = initialise


def _adam_betas_unchecked_patch() -> None:
    from torchrec_ascend.kernels import fused_adam

    original = fused_adam.check_hyper_parameters

    def check_hyper_parameters(fused_params: Any, tables: Any) -> None:
        original({k: v for k, v in (fused_params or {}).items() if k not in ("beta1", "beta2")}, tables)

    fused_adam.check_hyper_parameters = check_hyper_parameters


def _weight_ids_ignored_patch() -> None:
    from torchrec_ascend.checkpoint import stock

    def load_weight_ids(module: Any, state_dict: Any, prefix: str, attr: str) -> None:
        for name in stock._fused_hash_shards(module):  # taken out of the state_dict, never restored
            state_dict.pop(f"{prefix}{attr}.{name}.{stock.WEIGHT_ID}", None)

    stock.load_weight_ids = load_weight_ids


def _reserved_row_shown_patch() -> None:
    from torchrec_ascend.adapters.tbe import TBE

    original = TBE.hide_last_rows

    def hide_last_rows(self: Any, config: Any) -> None:
        optimizer = getattr(self._kernel, "_optim", None)
        original(self, config)
        if optimizer is not None:  # the fused optimizer is not rebuilt: its state still covers the whole pool
            self._kernel._optim = optimizer

    TBE.hide_last_rows = hide_last_rows


def _dense_drops_plain_patch() -> None:
    import re

    from torchrec_ascend.checkpoint import stock

    table = re.compile(r"(^|\.)(embedding_bags|embeddings)\.[^.]+\.(weight|weight_id)$")

    def dense_state_dict(model: Any) -> Any:  # every table left out, plain FUSED ones too (not only the Saver's)
        return {key: value for key, value in model.state_dict().items() if not table.search(key)}

    stock.dense_state_dict = dense_state_dict


def _cache_estimate_zero_patch() -> None:
    from torchrec_ascend.hooks import planner_storage

    # a KEY_VALUE shard's device cache and swap staging cost nothing in the plan (TorchRec's own figure)
    planner_storage.key_value_hbm = lambda *args, **kwargs: 0
    planner_storage.key_value_swap_hbm = lambda *args, **kwargs: 0


FAULTS = {
    "bucketize_off_by_one": _bucketize_off_by_one,
    "drop_update": _drop_update,
    "hash_bucketizer": _hash_bucketizer,
    "eviction_ids": _after_import("torchrec_ascend.hash.slot_table", _eviction_ids_patch),
    "kv_optimizer_state": _after_import("torchrec_ascend.kernels.key_value.tier", _kv_optimizer_state_patch),
    "saver_row": _after_import("torchrec_ascend.kernels.fused", _saver_row_patch),
    "dedup_reverse": _after_import("torchrec_ascend.sharders.index_dedup", _dedup_reverse_patch),
    "transfer_dropped": _after_import("torchrec_ascend.kernels.id_mapper", _transfer_dropped_patch),
    "fresh_state_fused": _after_import("torchrec_ascend.kernels.pool", _fresh_state_fused_patch),
    "fresh_state_key_value": _after_import("torchrec_ascend.kernels.key_value.tier", _fresh_state_key_value_patch),
    "pins_kept": _after_import("torchrec_ascend.kernels.id_mapper", _pins_kept_patch),
    "saver_removed": _after_import("torchrec_ascend.kernels.fused", _saver_removed_patch),
    "kv_state_dict_placeholder": _after_import("torchrec_ascend.checkpoint.key_value_state",
                                               _kv_state_dict_placeholder_patch),
    "policy_state_dropped": _after_import("torchrec_ascend.checkpoint.policy_state", _policy_state_dropped_patch),
    "double_policy_step": _after_import("torchrec_ascend.hash.slot_table", _double_policy_step_patch),
    "young_not_protected": _after_import("torchrec_ascend.policies.cadence", _young_not_protected_patch),
    "cadence_every_step": _after_import("torchrec_ascend.policies.cadence", _cadence_every_step_patch),
    "hash_sharding_unchecked": _after_import("torchrec_ascend.sharders", _hash_sharding_unchecked_patch),
    "whole_shard_short": _after_import("torchrec_ascend.kernels.key_value.kernel", _whole_shard_short_patch),
    "stage_wait_missing": _after_import("torchrec_ascend.pipeline.streams", _stage_wait_missing_patch),
    "record_stream_missing": _after_import("torchrec_ascend.pipeline.streams", _record_stream_missing_patch),
    "host_read_in_flight": _after_import("torchrec_ascend.sharders.hash_row_wise", _host_read_in_flight_patch),
    "item_per_step": _after_import("torchrec_ascend.kernels.fused", _item_per_step_patch),
    "cache_past_memory": _after_import("torchrec_ascend.kernels.key_value.kernel", _cache_past_memory_patch),
    "prefetch_check_syncs": _after_import("torchrec_ascend.kernels.id_mapper", _prefetch_check_syncs_patch),
    "prefetched_rows_unrecorded": _after_import("torchrec_ascend.kernels.id_mapper",
                                                _prefetched_rows_unrecorded_patch),
    "fused_not_prefetched": _after_import("torchrec_ascend.adapters.lookups", _fused_not_prefetched_patch),
    "not_admitted_row_trained": _after_import("torchrec_ascend.kernels.id_mapper", _not_admitted_row_trained_patch),
    "load_not_agreed": _after_import("torchrec_ascend.checkpoint.collectives", _load_not_agreed_patch),
    "ids_twice_accepted": _after_import("torchrec_ascend.checkpoint.key_value_state", _ids_twice_accepted_patch),
    "first_prefetch_unordered": _after_import("torchrec_ascend.kernels.id_mapper", _first_prefetch_unordered_patch),
    "full_table_silent": _after_import("torchrec_ascend.hash.slot_table", _full_table_silent_patch),
    "negative_id_unchecked": _after_import("torchrec_ascend.kernels.id_mapper", _negative_id_unchecked_patch),
    "small_cache_silent": _after_import("torchrec_ascend.hash.slot_table", _small_cache_silent_patch),
    "policy_no_suggestion": _after_import("torchrec_ascend.policies.registry", _policy_no_suggestion_patch),
    "path_escape_accepted": _after_import("torchrec_ascend.checkpoint.files", _path_escape_accepted_patch),
    "disk_checksum_partial": _after_import("torchrec_ascend.kernels.key_value.disk_record",
                                           _disk_checksum_partial_patch),
    "init_from_slot": _after_import("torchrec_ascend.kernels.pool", _init_from_slot_patch),
    "adam_betas_unchecked": _after_import("torchrec_ascend.kernels.fused_adam", _adam_betas_unchecked_patch),
    "weight_ids_ignored": _after_import("torchrec_ascend.checkpoint.stock", _weight_ids_ignored_patch),
    "reserved_row_shown": _after_import("torchrec_ascend.adapters.tbe", _reserved_row_shown_patch),
    "dense_drops_plain": _after_import("torchrec_ascend.checkpoint.stock", _dense_drops_plain_patch),
    "cache_estimate_zero": _after_import("torchrec_ascend.hooks.planner_storage", _cache_estimate_zero_patch),
}
for _name in os.environ[FAULT_ENV].split(","):
    FAULTS[_name]()

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
* ``small_cache_silent``: a KEY_VALUE batch with more distinct rows than the cache holds is not refused: the IDs
  that fit get rows (the batch's first ones) and the others read the reserved row.
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
* ``restores_not_undone``: a Saver load that fails after the rows were read leaves the rows a rank stored ahead
  in the KEY_VALUE tiers of an untrained model (``discard_restores`` undoes nothing).
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
* ``detach_drops_batches``: ``HybridTrainPipelineSparseDist.detach()`` drops the finished batches it should keep.
* ``stage_error_misnamed``: a pipeline stage's failure names the batch after the one that failed.
* ``eval_assigns_rows``: a hash table in eval gives unknown IDs rows (as in training) instead of the not-admitted one.
* ``rows_without_ids_accepted``: a stock ``state_dict()`` holding a FUSED hash table's rows without ``weight_id`` is
  loaded (the rows are read as other IDs' rows).
* ``misplaced_ids_accepted``: a FUSED hash table's ``weight_id`` loads onto shards without the ownership check.
* ``adam_step_off_by_one``: fused ADAM's bias correction uses the step after the current one.
* ``tiers_unread_in_eval``: an evaluation batch larger than the KEY_VALUE cache finds no row in host memory or on
  disk (they read the not-admitted vector).
* ``fp16_rows_rounded``: an FP16 KEY_VALUE table's rows are rounded to BF16 on their way out of the cache.
* ``bf16_noise_by_slot``: a BF16 table's stochastic rounding draws its noise by the row's slot, not by the row's
  first place in the batch (so a KEY_VALUE cache rounds otherwise than FUSED).

Faults of the injection hooks stock modules run through (full-run cases of the sharding check). A hook's wrapper is
installed once, at import, but calls the hook module's own functions by name at each call, so replacing one of those
reaches the stock code path:

* ``copy_deep_copies_groups``: ``DMP.copy()``'s patched ``sharded_model_copy`` marks no class as shared, so the copy
  deep-copies the process groups.
* ``uneven_gradient_reversed``: the backward of an uneven reduce-scatter (per-rank batch sizes that differ, an empty
  batch, VBE) sends each sample's gradient to the sample at the other end of the batch.
* ``streams_unfilled``: TorchRec's pipelines get no streams on a device TorchRec does not manage (``fill_streams``
  does nothing), so they copy, distribute and compute on one stream: nothing overlaps (emulated NPU only).
* ``prefetch_left_to_streams``: without streams (the CPU), ``PrefetchTrainPipelineSparseDist``'s prefetch step does
  nothing again (stock TorchRec's behaviour there), so the batch never reaches the forward.

More faults of quick checks, of parts outside the kernels:

* ``backend_no_suggestion``: an unknown backend name is refused without the closest valid name.
* ``patch_fails``: every injection patch raises when applied (as when TorchRec moved its targets).
* ``swaps_uncounted``: ``cache_metrics`` reports no rows swapped in or out.
* ``composite_state_partial``: a composed eviction policy (``"ttl+lfu"``) saves its ranker's state alone.
* ``last_batches_dropped``: ``HybridTrainPipelineSparseDist`` stops when the data runs out, dropping the batches
  still in flight.

``TORCHREC_ASCEND_TEST_FAULT`` may name several faults, comma-separated. ``FAULT@TEST`` scopes a fault to one
test of the run (``test_case[ebc-row_wise-sgd]``, ``test_unknown_policy_suggests_the_closest``; repeat it for more):
the broken part behaves as the healthy one everywhere else. So one run can carry a fault per case and show each case
failing with its own fault, where a run per fault would start the suite, torchrun and torchrec each time. A scoped
fault is active in a rank while that rank runs the case of that id (the scripts' case loop, ``case_loop.main``), and
in the suite's own process (and what it starts outside torchrun) while pytest runs that test
(``PYTEST_CURRENT_TEST``). A fault that replaces something other than a function cannot be scoped: naming it
scoped is an error.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Set

import torch

FAULT_ENV = "TORCHREC_ASCEND_TEST_FAULT"
#: fault -> the tests it is scoped to (``None``: active everywhere), from ``FAULT_ENV``.
_SCOPES: Dict[str, Optional[Set[str]]] = {}
#: The fault whose patch runs now, and the id of the case this rank runs now (``None``: between cases).
_INSTALLING: List[Optional[str]] = [None]
_CASE: List[Optional[str]] = [None]


def _active(fault: str) -> bool:
    """Whether ``fault`` breaks its part here and now (see the module docstring)."""
    scopes = _SCOPES[fault]
    if scopes is None:
        return True
    if "LOCAL_RANK" in os.environ:  # a rank of a script: the case it runs
        return _CASE[0] is not None and any(scope.endswith(f"[{_CASE[0]}]") for scope in scopes)
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.split("::")[-1].rsplit(" (", 1)[0] in scopes


def _replace(owner: Any, name: str, broken: Any) -> None:
    """Set ``owner.name`` to ``broken`` for the fault being installed; scoped, a function that calls ``broken``
    while the fault is active and the healthy one otherwise."""
    fault = _INSTALLING[0]
    assert fault is not None, "a fault's patch runs through _install"
    if _SCOPES[fault] is None:
        setattr(owner, name, broken)
        return
    healthy = getattr(owner, name)
    if not callable(broken) or isinstance(inspect.getattr_static(owner, name), (staticmethod, classmethod)):
        raise RuntimeError(f"fault {fault!r} replaces {name}, which is not a plain function: it cannot be scoped")

    @functools.wraps(broken)
    def gated(*args: Any, **kwargs: Any) -> Any:
        return (broken if _active(fault) else healthy)(*args, **kwargs)

    setattr(owner, name, gated)


def _track_cases(name: str) -> None:
    """Wrap the scripts' case loop (module ``name``) so a rank knows the id of the case it runs (``Case.id``)."""
    module = sys.modules[name]
    loop = module.main

    def main(description: str, run_case: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def tracked(case: Dict[str, Any], pg: Any) -> Any:
            _CASE[0] = "-".join(str(v) for v in case.values())
            try:
                return run_case(case, pg)
            finally:
                _CASE[0] = None

        return loop(description, tracked, *args, **kwargs)

    module.main = main


def _bucketize_off_by_one() -> None:
    import fbgemm_gpu  # noqa: F401  (registers the fbgemm ops)

    original = torch.ops.fbgemm.block_bucketize_sparse_features

    def off_by_one(*args: Any, **kwargs: Any) -> Any:
        kwargs["block_sizes"] = kwargs["block_sizes"] + 1
        return original(*args, **kwargs)

    _replace(torch.ops.fbgemm, "block_bucketize_sparse_features", off_by_one)


def _drop_update() -> None:
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen

    original = SplitTableBatchedEmbeddingBagsCodegen.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if not (self.training and torch.is_grad_enabled()):
            return out
        self.fault_calls = getattr(self, "fault_calls", 0) + 1
        return out.detach().requires_grad_() if self.fault_calls == 2 else out

    _replace(SplitTableBatchedEmbeddingBagsCodegen, "forward", forward)


def _when_imported(name: str, then: Callable[[], None]) -> None:
    """Call ``then`` once module ``name`` is imported (plugins load while TorchRec is half imported)."""

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            run = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                then()

            spec.loader.exec_module = exec_module
            return spec

    if name in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, Finder())


def _after_import(name: Optional[str], patch: Callable[[], None]) -> Callable[[str], None]:
    """A fault's installer: ``patch`` runs as that fault once module ``name`` is imported (at once if ``None``)."""

    def install(fault: str) -> None:
        def run() -> None:
            _INSTALLING[0] = fault
            try:
                patch()
            finally:
                _INSTALLING[0] = None

        _when_imported(name, run) if name else run()

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

    _replace(ops, "hash_bucketize", shifted)


def _eviction_ids_patch() -> None:
    from torchrec_ascend.hash.slot_table import SlotTable

    original = SlotTable.assign

    def assign(
        self: Any, ids: Any, training: bool, known: Any = None, signals: Any = None, on_evict: Any = None
    ) -> Any:
        rotated = None if on_evict is None else (lambda slots, evicted: on_evict(slots, evicted.roll(1)))
        return original(self, ids, training, known=known, signals=signals, on_evict=rotated)

    _replace(SlotTable, "assign", assign)


def _kv_optimizer_state_patch() -> None:
    from torchrec_ascend.kernels.key_value.tier import HostDiskTier

    def left(self: Any, t: int, slots: Any, ids: Any) -> None:
        rows = self._pool.pack_stored(t, slots)
        rows[:, self._pool.cols(t):] = 0  # the state's bits: 0.0 whatever the encoding
        self.stores[t].put(ids, rows)
        self.swaps[t]["swapped_out"] += ids.numel()

    _replace(HostDiskTier, "left", left)


def _saver_row_patch() -> None:
    import itertools

    from torchrec_ascend.kernels.fused import HashRows, ShardRows

    original = HashRows.export_shard

    def export_shard(self: Any, t: int, changed_only: bool = False) -> Any:
        blocks, removed = original(self, t, changed_only)
        pool = next(blocks)
        cut = ShardRows(pool.ids[:-1], pool.slots[:-1], pool.last_used[:-1], pool.rows[:-1])
        return itertools.chain([cut], blocks), removed

    _replace(HashRows, "export_shard", export_shard)


def _dedup_reverse_patch() -> None:
    from torchrec_ascend.sharders import index_dedup

    original = index_dedup.dedup_per_table

    def dedup_per_table(features: Any, groups: Any, accumulate_weights: bool = False) -> Any:
        deduped, reverse = original(features, groups, accumulate_weights)
        n = deduped.values().numel()
        return deduped, (reverse + 1) % max(n, 1)

    _replace(index_dedup, "dedup_per_table", dedup_per_table)


def _transfer_dropped_patch() -> None:
    from torchrec_ascend.kernels.id_mapper import IdMapper

    original = IdMapper.map_on_host

    def map_on_host(self: Any, on_host: Any, device: Any) -> Any:
        rows, assignments = original(self, on_host, device)
        return rows.to("cpu"), assignments  # the rows stay on the host

    _replace(IdMapper, "map_on_host", map_on_host)


def _fresh_state_fused_patch() -> None:
    from torchrec_ascend.kernels.pool import Pool

    def initialise(self: Any, t: int, assignment: Any) -> None:
        weights = self._tbe.weights(t)
        with torch.no_grad():  # the initial values, but the optimizer states are left as they were
            weights[assignment.new_slots.to(weights.device)] = self.initial_rows(t, assignment.new_ids).to(
                dtype=weights.dtype, device=weights.device)

    _replace(Pool, "initialise", initialise)


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

    _replace(HostDiskTier, "arrived", arrived)


def _pins_kept_patch() -> None:
    from torchrec_ascend.kernels.id_mapper import IdMapper, Pins

    original = IdMapper.lookup

    def lookup(self: Any, features: Any) -> Any:
        # the previous batch's pins are forgotten, never released (whether it read the reserved row is kept)
        self._in_compute = Pins([], self._in_compute.default_used)
        return original(self, features)

    _replace(IdMapper, "lookup", lookup)


def _saver_removed_patch() -> None:
    from torchrec_ascend.kernels.fused import HashRows

    original = HashRows.export_shard

    def export_shard(self: Any, t: int, changed_only: bool = False) -> Any:
        blocks, removed = original(self, t, changed_only)
        return blocks, lambda: removed()[:0]

    _replace(HashRows, "export_shard", export_shard)


def _kv_state_dict_placeholder_patch() -> None:
    from torchrec_ascend.checkpoint import key_value_state

    _replace(key_value_state, "add_key_value_entries", lambda module, destination, prefix, attr: None)


def _policy_state_dropped_patch() -> None:
    from torchrec_ascend.checkpoint import policy_state

    _replace(policy_state, "take_loaded", lambda kernel, t: None)


def _double_policy_step_patch() -> None:
    from torchrec_ascend.hash.slot_table import SlotTable

    original = SlotTable.assign

    def assign(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = self.step
        out = original(self, *args, **kwargs)
        self.step += self.step - before  # a step taken (training) is taken twice
        return out

    _replace(SlotTable, "assign", assign)


def _young_not_protected_patch() -> None:
    from torchrec_ascend.policies.cadence import EvictionCadence

    original = EvictionCadence.select

    def select(self: Any, policy: Any, num: int, evictable: Any, step: int) -> Any:
        self.inserted_step.fill_(-(1 << 40))  # every row as old as can be: none is young
        return original(self, policy, num, evictable, step)

    _replace(EvictionCadence, "select", select)


def _cadence_every_step_patch() -> None:
    from torchrec_ascend.policies.cadence import EvictionCadence

    _replace(EvictionCadence, "due", lambda self, step: True)


def _hash_sharding_unchecked_patch() -> None:
    from torchrec_ascend import sharders

    _replace(sharders, "HASH_SHARDING_TYPES", (*sharders.HASH_SHARDING_TYPES, "table_row_wise"))


def _whole_shard_short_patch() -> None:
    from torchrec_ascend.kernels.key_value import kernel

    original = kernel._cache_table

    def cache_table(table: Any, load_factor: Any) -> Any:
        if load_factor != 1.0:
            return original(table, load_factor)
        return kernel.with_block_rows(table, lambda rows: kernel.cache_rows(rows, 1 / 16))

    _replace(kernel, "_cache_table", cache_table)


def _stage_wait_missing_patch() -> None:
    from torchrec_ascend.pipeline.streams import PipelineStreams

    def wait(self: Any, event: Any, tensors: Any = None) -> None:
        if event is not None and tensors is not None:  # the batch is recorded, but nothing waits for its event
            tensors.record_stream(self._module.current_stream())

    _replace(PipelineStreams, "wait", wait)


def _record_stream_missing_patch() -> None:
    from torchrec_ascend.pipeline.streams import PipelineStreams

    def wait(self: Any, event: Any, tensors: Any = None) -> None:
        if event is not None:  # waits, but the batch is not recorded on this stream
            self._module.current_stream().wait_event(event)

    _replace(PipelineStreams, "wait", wait)


def _host_read_in_flight_patch() -> None:
    from torchrec_ascend.sharders import hash_row_wise

    original = hash_row_wise._move

    def move(tensors: Any, device: Any, non_blocking: bool) -> Any:
        return original(tensors, device, True)  # also towards the host, whose reads then do not wait

    _replace(hash_row_wise, "_move", move)


def _cache_past_memory_patch() -> None:
    from torchrec_ascend.kernels.key_value import kernel

    original = kernel.cache_rows

    def cache_table(table: Any, load_factor: Any) -> Any:
        return kernel.with_block_rows(table, lambda rows: original(rows, load_factor) * 16384)

    _replace(kernel, "_cache_table", cache_table)


def _item_per_step_patch() -> None:
    from torchrec_ascend.kernels.fused import HashFusedEmbeddingBag

    original = HashFusedEmbeddingBag.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if self.training and out.numel():
            out.detach().reshape(-1)[0].item()  # e.g. a loss or norm logged every step
        return out

    _replace(HashFusedEmbeddingBag, "forward", forward)


def _prefetch_check_syncs_patch() -> None:
    from torchrec_ascend.kernels import id_mapper

    _replace(id_mapper, "_same_tensor_data", lambda a, b: a is b or torch.equal(a, b))


def _prefetched_rows_unrecorded_patch() -> None:
    from torchrec_ascend.kernels import id_mapper

    _replace(id_mapper, "handed_to_this_stream", lambda tensor: tensor)


def _not_admitted_row_trained_patch() -> None:
    from torchrec_ascend.kernels.id_mapper import IdMapper

    original = IdMapper._rewrite_default_rows

    def rewrite_default_rows(self: Any, moved: Any) -> None:
        if not getattr(self, "fault_default_rows_written", False):
            self.fault_default_rows_written = True
            original(self, [True] * len(moved))

    _replace(IdMapper, "_rewrite_default_rows", rewrite_default_rows)


def _fused_not_prefetched_patch() -> None:
    from torchrec_ascend.adapters import lookups

    _replace(lookups, "kernels_with_features", lambda lookup, features: iter(()))


def _load_not_agreed_patch() -> None:
    from torchrec_ascend.checkpoint.collectives import Group

    def agree(self: Any, what: str, error: Any) -> None:  # a rank learns only of its own failure
        if error is not None:
            raise error

    _replace(Group, "agree", agree)


def _restores_not_undone_patch() -> None:
    from torchrec_ascend.checkpoint import restore, saver

    for module in (restore, saver):  # saver imported the function by name
        _replace(module, "discard_restores", lambda restores: None)


def _ids_twice_accepted_patch() -> None:
    from torchrec_ascend.checkpoint.key_value_state import TableView

    _replace(TableView, "_check_ids", lambda self, ids: None)


def _first_prefetch_unordered_patch() -> None:
    from torchrec_ascend.kernels.id_mapper import IdMapper

    def wait_for_pool_writes(self: Any, device: Any, forward_stream: Any) -> None:
        if self._released is not None:  # the lookups' event only: the first prefetch waits for nothing
            torch.accelerator.current_stream(device).wait_event(self._released)

    _replace(IdMapper, "_wait_for_pool_writes", wait_for_pool_writes)


def _full_table_silent_patch() -> None:
    from torchrec_ascend.errors import CapacityError
    from torchrec_ascend.hash.slot_table import Assignment, SlotTable

    original = SlotTable._insert_all

    def insert_all(self: Any, ids: Any) -> Any:
        try:
            return original(self, ids)
        except CapacityError:  # the batch reads the reserved row instead
            return Assignment(slots=torch.full_like(ids, self.default_slot))

    _replace(SlotTable, "_insert_all", insert_all)


def _negative_id_unchecked_patch() -> None:
    from torchrec_ascend.kernels import id_mapper

    _replace(id_mapper, "check_non_negative_ids", lambda *args, **kwargs: None)


def _small_cache_silent_patch() -> None:
    from torchrec_ascend.errors import CapacityError
    from torchrec_ascend.hash.slot_table import Assignment, SlotTable

    original = SlotTable.assign

    def assign(self: Any, ids: Any, training: bool, known: Any = None, signals: Any = None,
               on_evict: Any = None) -> Any:
        try:
            return original(self, ids, training, known, signals, on_evict)
        except CapacityError:
            if self.overflow == "error" or signals:
                raise
        # room for what fits: the batch's first IDs get rows (halving until they fit), the rest read the reserved row
        fits = ids.numel()
        while True:
            fits //= 2
            try:
                head = original(self, ids[:fits], training, known, None, on_evict)
                break
            except CapacityError:
                continue
        slots = torch.full_like(ids, self.default_slot)
        slots[:fits] = head.slots
        return Assignment(slots=slots, new_slots=head.new_slots, new_ids=head.new_ids,
                          evicted_slots=head.evicted_slots, evicted_ids=head.evicted_ids)

    _replace(SlotTable, "assign", assign)


def _policy_no_suggestion_patch() -> None:
    from torchrec_ascend.policies import registry

    _replace(registry, "_suggest", lambda name, known: "")


def _path_escape_accepted_patch() -> None:
    import os

    from torchrec_ascend.checkpoint import files

    original = files.confined

    def confined(directory: str, name: Any, what: str) -> str:
        if isinstance(name, str) and name not in ("", ".", ".."):  # a name with separators is joined as it is
            return os.path.join(directory, name)
        return original(directory, name, what)

    _replace(files, "confined", confined)


def _disk_checksum_partial_patch() -> None:
    from torchrec_ascend.kernels.key_value.disk_record import RecordFormat

    original = RecordFormat.__init__

    def __init__(self: Any, width: int, dtype: Any) -> None:
        original(self, width, dtype)
        self._multipliers = self._multipliers.copy()
        self._multipliers[2:] = 0  # the checksum covers the key and the location, not the row's bytes

    _replace(RecordFormat, "__init__", __init__)


def _init_from_slot_patch() -> None:
    import dataclasses

    from torchrec_ascend.kernels.pool import Pool

    original = Pool.initialise

    def initialise(self: Any, t: int, assignment: Any) -> None:
        # a new row's initial values are those of its slot (arrival order), not of its ID
        original(self, t, dataclasses.replace(assignment, new_ids=assignment.new_slots))

    _replace(Pool, "initialise", initialise)


def _adam_betas_unchecked_patch() -> None:
    from torchrec_ascend.kernels import fused_optimizers

    original = fused_optimizers.check_hyper_parameters

    def check_hyper_parameters(fused_params: Any, *args: Any) -> None:
        original({k: v for k, v in (fused_params or {}).items() if k not in ("beta1", "beta2")}, *args)

    _replace(fused_optimizers, "check_hyper_parameters", check_hyper_parameters)


def _weight_ids_ignored_patch() -> None:
    from torchrec_ascend.checkpoint import stock

    def load_weight_ids(module: Any, state_dict: Any, prefix: str, attr: str) -> None:
        for name in stock._fused_hash_shards(module):  # taken out of the state_dict, never restored
            state_dict.pop(f"{prefix}{attr}.{name}.{stock.WEIGHT_ID}", None)

    _replace(stock, "load_weight_ids", load_weight_ids)


def _reserved_row_shown_patch() -> None:
    from torchrec_ascend.adapters.tbe import TBE

    original = TBE.hide_last_rows

    def hide_last_rows(self: Any, config: Any) -> None:
        optimizer = getattr(self._kernel, "_optim", None)
        original(self, config)
        if optimizer is not None:  # the fused optimizer is not rebuilt: its state still covers the whole pool
            self._kernel._optim = optimizer

    _replace(TBE, "hide_last_rows", hide_last_rows)


def _dense_drops_plain_patch() -> None:
    import re

    from torchrec_ascend.checkpoint import stock

    table = re.compile(r"(^|\.)(embedding_bags|embeddings)\.[^.]+\.(weight|weight_id)$")

    def dense_state_dict(model: Any) -> Any:  # every table left out, plain FUSED ones too (not only the Saver's)
        return {key: value for key, value in model.state_dict().items() if not table.search(key)}

    _replace(stock, "dense_state_dict", dense_state_dict)


def _cache_estimate_zero_patch() -> None:
    from torchrec_ascend.hooks import planner_storage

    # a KEY_VALUE shard's device cache and swap staging cost nothing in the plan (TorchRec's own figure)
    _replace(planner_storage, "key_value_hbm", lambda *args, **kwargs: 0)
    _replace(planner_storage, "key_value_swap_hbm", lambda *args, **kwargs: 0)


def _backend_no_suggestion_patch() -> None:
    from torchrec_ascend import backends

    original = backends._resolve

    def resolve(name: str, known: Any) -> Any:
        try:
            return original(name, known)
        except backends.BackendError as err:  # the valid names, without the closest one
            raise backends.BackendError(str(err).split(" Did you mean")[0]) from None

    _replace(backends, "_resolve", resolve)


def _patch_fails_patch() -> None:
    from torchrec_ascend.injection.patch import Patch

    def apply(self: Any) -> Any:
        raise AttributeError(f"{self.target} is gone")  # as a TorchRec whose target moved

    _replace(Patch, "apply", apply)


def _swaps_uncounted_patch() -> None:
    from torchrec_ascend.kernels.key_value.kernel import KeyValueRows

    original = KeyValueRows.cache_stats

    def cache_stats(self: Any) -> Any:
        return {name: {**stats, "swapped_in": 0, "swapped_out": 0} for name, stats in original(self).items()}

    _replace(KeyValueRows, "cache_stats", cache_stats)


def _composite_state_partial_patch() -> None:
    from torchrec_ascend.policies.compose import CompositeEvictionPolicy

    def state_dict(self: Any) -> Any:  # the ranker's state alone: the filters' (e.g. TTL's) is lost
        return {f"{self.names[-1]}.{key}": value for key, value in self.ranker.state_dict().items()}

    _replace(CompositeEvictionPolicy, "state_dict", state_dict)


def _last_batches_dropped_patch() -> None:
    from torchrec_ascend.pipeline.hybrid import HybridTrainPipelineSparseDist

    original = HybridTrainPipelineSparseDist.progress

    def progress(self: Any, dataloader_iter: Any) -> Any:
        source = self._source
        if source is not None and source.iterator is dataloader_iter and source.exhausted:
            self._drop_in_flight()  # the batches still in flight when the data ran out are lost
            raise StopIteration
        return original(self, dataloader_iter)

    _replace(HybridTrainPipelineSparseDist, "progress", progress)


def _detach_drops_batches_patch() -> None:
    from torchrec_ascend.pipeline.hybrid import HybridTrainPipelineSparseDist

    original = HybridTrainPipelineSparseDist.detach

    def detach(self: Any) -> Any:
        model = original(self)
        self._in_flight.clear()  # the finished batches are not kept for after re-attaching
        return model

    _replace(HybridTrainPipelineSparseDist, "detach", detach)


def _stage_error_misnamed_patch() -> None:
    from torchrec_ascend.pipeline import hybrid

    original = hybrid._with_detail

    def with_detail(err: Any, detail: str) -> Any:
        named = original(err, detail)
        return hybrid.PipelineStageError(named.stage, named.batch_index + 1, named.__cause__ or named, detail)

    _replace(hybrid, "_with_detail", with_detail)


def _eval_assigns_rows_patch() -> None:
    from torchrec_ascend.hash.slot_table import SlotTable

    original = SlotTable.assign

    def assign(self: Any, ids: Any, training: bool, *args: Any, **kwargs: Any) -> Any:
        return original(self, ids, True, *args, **kwargs)  # unknown IDs get rows in eval too

    _replace(SlotTable, "assign", assign)


def _rows_without_ids_accepted_patch() -> None:
    from torchrec_ascend.checkpoint import stock

    _replace(stock, "refuse_rows_without_ids", lambda state_dict, table_key, name: None)


def _misplaced_ids_accepted_patch() -> None:
    from torchrec_ascend.checkpoint import stock

    original = stock._restore_ids

    def restore_ids(kernel: Any, t: int, row_ids: Any, key: str, placed: bool) -> None:
        original(kernel, t, row_ids, key, False)  # ownership never checked

    _replace(stock, "_restore_ids", restore_ids)


def _adam_step_off_by_one_patch() -> None:
    from torchrec_ascend.kernels.fused_optimizers import _FusedLookup

    original = _FusedLookup._step

    def step(self: Any, *args: Any) -> None:
        original(self, *args[:-1], args[-1] + 1)  # bias correction one step ahead

    _replace(_FusedLookup, "_step", step)


def _tiers_unread_in_eval_patch() -> None:
    from torchrec_ascend.kernels.key_value.tier import HostDiskTier

    original = HostDiskTier.read

    def read(self: Any, t: int, keys: Any) -> Any:
        stored, found = original(self, t, keys)
        return stored, torch.zeros_like(found)  # the rows below the cache are not found

    _replace(HostDiskTier, "read", read)


def _bf16_noise_by_slot_patch() -> None:
    from torchrec_ascend.kernels.fused_optimizers import _FusedLookup

    original = _FusedLookup._write_weights

    def write_weights(self: Any, w_pos: Any, values: Any, leader: Any, step: Any) -> None:
        original(self, w_pos, values, w_pos[:, 0], step)  # the noise follows the slot

    _replace(_FusedLookup, "_write_weights", write_weights)


def _fp16_rows_rounded_patch() -> None:
    from torchrec_ascend.kernels.pool import Pool

    original = Pool.pack_stored

    def pack_stored(self: Any, t: int, slots: Any) -> Any:
        rows = original(self, t, slots)
        if self._tbe.weights(t).dtype == torch.float16:  # FP16 rows leave the cache rounded to BF16
            packed = self.codec(t).decode(rows)
            packed[:, :self.cols(t)] = packed[:, :self.cols(t)].bfloat16().float()
            rows = self.codec(t).encode(packed)
        return rows

    _replace(Pool, "pack_stored", pack_stored)



def _copy_deep_copies_groups_patch() -> None:
    from torchrec_ascend.hooks import process_group

    _replace(process_group, "no_copy_classes", lambda: [])


def _uneven_gradient_reversed_patch() -> None:
    from torchrec_ascend.hooks import uneven_collectives

    original = uneven_collectives.scatter_uneven_gradient

    def scatter_uneven_gradient(ctx: Any, grad_output: Any) -> Any:  # (not scaled: Adagrad would undo a scale)
        return original(ctx, grad_output.flip(0))

    _replace(uneven_collectives, "scatter_uneven_gradient", scatter_uneven_gradient)


def _streams_unfilled_patch() -> None:
    from torchrec_ascend.hooks import pipeline_streams

    _replace(pipeline_streams, "fill_streams", lambda pipeline, device=None: None)


def _prefetch_left_to_streams_patch() -> None:
    from torchrec_ascend.hooks import pipeline_streams

    _replace(pipeline_streams, "prefetch_in_program_order", lambda context, pipelined_modules: None)

FAULTS = {
    "bucketize_off_by_one": _after_import(None, _bucketize_off_by_one),
    "drop_update": _after_import(None, _drop_update),
    "hash_bucketizer": _after_import(None, _hash_bucketizer),
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
    "restores_not_undone": _after_import("torchrec_ascend.checkpoint.saver", _restores_not_undone_patch),
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
    "adam_betas_unchecked": _after_import("torchrec_ascend.kernels.fused_optimizers", _adam_betas_unchecked_patch),
    "weight_ids_ignored": _after_import("torchrec_ascend.checkpoint.stock", _weight_ids_ignored_patch),
    "reserved_row_shown": _after_import("torchrec_ascend.adapters.tbe", _reserved_row_shown_patch),
    "dense_drops_plain": _after_import("torchrec_ascend.checkpoint.stock", _dense_drops_plain_patch),
    "cache_estimate_zero": _after_import("torchrec_ascend.hooks.planner_storage", _cache_estimate_zero_patch),
    "backend_no_suggestion": _after_import("torchrec_ascend.backends", _backend_no_suggestion_patch),
    "patch_fails": _after_import("torchrec_ascend.injection.patch", _patch_fails_patch),
    "swaps_uncounted": _after_import("torchrec_ascend.kernels.key_value.kernel", _swaps_uncounted_patch),
    "composite_state_partial": _after_import("torchrec_ascend.policies.compose", _composite_state_partial_patch),
    "last_batches_dropped": _after_import("torchrec_ascend.pipeline.hybrid", _last_batches_dropped_patch),
    "detach_drops_batches": _after_import("torchrec_ascend.pipeline.hybrid", _detach_drops_batches_patch),
    "stage_error_misnamed": _after_import("torchrec_ascend.pipeline.hybrid", _stage_error_misnamed_patch),
    "eval_assigns_rows": _after_import("torchrec_ascend.hash.slot_table", _eval_assigns_rows_patch),
    "rows_without_ids_accepted": _after_import("torchrec_ascend.checkpoint.stock", _rows_without_ids_accepted_patch),
    "misplaced_ids_accepted": _after_import("torchrec_ascend.checkpoint.stock", _misplaced_ids_accepted_patch),
    "adam_step_off_by_one": _after_import("torchrec_ascend.kernels.fused_optimizers", _adam_step_off_by_one_patch),
    "tiers_unread_in_eval": _after_import("torchrec_ascend.kernels.key_value.tier", _tiers_unread_in_eval_patch),
    "fp16_rows_rounded": _after_import("torchrec_ascend.kernels.pool", _fp16_rows_rounded_patch),
    "bf16_noise_by_slot": _after_import("torchrec_ascend.kernels.fused_optimizers", _bf16_noise_by_slot_patch),
    "copy_deep_copies_groups": _after_import("torchrec_ascend.hooks.process_group", _copy_deep_copies_groups_patch),
    "uneven_gradient_reversed": _after_import("torchrec_ascend.hooks.uneven_collectives",
                                              _uneven_gradient_reversed_patch),
    "streams_unfilled": _after_import("torchrec_ascend.hooks.pipeline_streams", _streams_unfilled_patch),
    "prefetch_left_to_streams": _after_import("torchrec_ascend.hooks.pipeline_streams",
                                              _prefetch_left_to_streams_patch),
}
for _entry in os.environ[FAULT_ENV].split(","):
    _fault, _, _scope = _entry.partition("@")
    if not _scope:
        _SCOPES[_fault] = None
    elif _SCOPES.setdefault(_fault, set()) is not None:  # (named unscoped too: active everywhere)
        _SCOPES[_fault].add(_scope)  # type: ignore[union-attr]  # a scoped fault's set
if any(_SCOPES.values()):
    for _loop in ("torchrec_ascend.conformance_tests.stock.case_loop", "case_loop"):  # as a package, as a script
        _when_imported(_loop, functools.partial(_track_cases, _loop))
for _fault in _SCOPES:
    FAULTS[_fault](_fault)

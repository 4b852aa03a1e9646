"""SlotTable: the ID side of one shard of a hash (or KEY_VALUE) table.

A kernel owns a fixed pool of rows (fbgemm TBE rows); the slot table decides which row each raw ID of a batch uses:
it looks IDs up in an :class:`~torchrec_ascend.hash.id_map.IdMap`, asks the admission policy about IDs it has
never seen, frees rows through the eviction policy when the pool is full (never rows in use by the batches still in
flight), and counts all of it. It never touches row contents: the kernel initialises (or loads) the rows it is told
are new and saves (or drops) the rows it is told were evicted.

The pool has one row more than the shard holds IDs: its last row is reserved (outside ``num_embeddings``, hidden
from state_dict), and rejected IDs, and IDs unknown in eval mode, read it as the table's ``not_admitted_value``
vector; the kernel rewrites it before each lookup.

Example::

    table = SlotTable("user", HashTableSpec(), rows=1001, overflow="error")
    a = table.assign(torch.tensor([7, 42, 7]), training=True)
    a.slots       # tensor([0, 1, 0]); a.new_slots == [0, 1], a.new_ids == [7, 42]
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch

from torchrec_ascend.errors import CapacityError, ConfigError, StorageError
from torchrec_ascend.hash.configs import DEFAULT_EVICTION_POLICY, HashTableSpec
from torchrec_ascend.hash.id_map import IdMap
from torchrec_ascend.native import ops

if TYPE_CHECKING:
    from torchrec_ascend.policies.base import AdmissionPolicy, EvictionPolicy
    from torchrec_ascend.policies.cadence import EvictionCadence

_EMPTY = torch.empty(0, dtype=torch.int64)
NEVER_USED = -(2**62)  # last_used of a row no ID has used: older than any step
COUNTERS = ("lookups", "hits", "inserted", "evicted", "rejected", "unknown_in_eval")  # stats() keys


@dataclasses.dataclass
class Assignment:
    """Rows for one batch of a table's IDs.

    Attributes:
        slots: int64 ``[n]``, the row of every input ID (the reserved default row for rejected/unknown IDs).
        new_slots: rows that now hold an ID they did not hold before the call; the kernel fills them.
        new_ids: the IDs of ``new_slots``, aligned.
        evicted_slots: rows freed by this call (before being handed to new IDs); the kernel saves or drops them.
        evicted_ids: the IDs those rows held, aligned.
        default_used: whether some ID reads the reserved default row (True where unknown: the safe answer, as the
            kernel then rewrites that row before the next batch).
    """

    slots: torch.Tensor
    new_slots: torch.Tensor = _EMPTY
    new_ids: torch.Tensor = _EMPTY
    evicted_slots: torch.Tensor = _EMPTY
    evicted_ids: torch.Tensor = _EMPTY
    default_used: bool = True


def refuse_unused_eviction_settings(table: str, spec: HashTableSpec, overflow: str) -> None:
    """Refuse eviction settings a table that never evicts would ignore (``overflow="error"`` outside a KEY_VALUE
    device cache): a non-default ``eviction_policy``, ``eviction_options`` or ``eviction_cadence``.

    Raises:
        ConfigError: naming the table and the settings given.

    Example::

        refuse_unused_eviction_settings("user", HashTableSpec(eviction_policy="lfu"), "error")  # raises
    """
    unused = {"eviction_policy": spec.eviction_policy, "eviction_options": dict(spec.eviction_options),
              "eviction_cadence": dict(spec.eviction_cadence)}
    unused = {k: v for k, v in unused.items() if v and v != DEFAULT_EVICTION_POLICY}
    if overflow == "error" and unused:
        given = ", ".join(f"{k}={v!r}" for k, v in unused.items())
        raise ConfigError(
            f"table {table!r}: {given} would be ignored: with overflow='error' this table never evicts. Set "
            "overflow='evict' to evict by them, or remove them (a KEY_VALUE table's device cache evicts by them "
            "whatever its overflow)"
        )


class SlotTable(torch.nn.Module):
    """Maps a shard's raw IDs to rows of a fixed pool, with admission, eviction and counters.

    Args:
        table: table name (for messages and metrics).
        spec: the table's hash options.
        rows: rows in the pool: the shard's rows plus the reserved default row (so ``rows - 1`` IDs fit).
        overflow: ``"error"`` raises :class:`CapacityError` when the pool is full; ``"evict"`` frees rows chosen
            by the eviction policy (a KEY_VALUE device cache always evicts).
        refuse_unused: refuse eviction settings ``overflow="error"`` would ignore (see
            :func:`refuse_unused_eviction_settings`); the unsharded modules check at their first training batch
            instead, since a config may be built unsharded only to be sharded as KEY_VALUE.

    Raises:
        ConfigError: a shard without rows (``rows < 2``), an unknown overflow rule or policy name, or eviction
            settings a table that never evicts would ignore.
    """

    # The buffers registered in __init__, typed (nn.Module's attribute lookup would type them as Tensor | Module).
    slot_ids: torch.Tensor
    last_used: torch.Tensor
    pins: torch.Tensor

    def __init__(self, table: str, spec: HashTableSpec, rows: int, overflow: str, refuse_unused: bool = True) -> None:
        super().__init__()
        self.refuse_unused = refuse_unused
        if rows < 2:
            raise ConfigError(
                f"table {table!r}: a shard has {rows - 1} row(s) for IDs; it needs at least 1. Raise num_embeddings "
                "to at least the number of shards (or the cache load_factor)."
            )
        if overflow not in ("error", "evict"):
            raise ConfigError(f"table {table!r}: overflow must be 'error' or 'evict', got {overflow!r}")
        self.table = table
        self.spec = spec
        self.capacity = rows - 1
        self.default_slot = rows - 1
        self.overflow = overflow
        # Batches whose rows are pinned against eviction: rows are chosen in each batch's own lookup, after the
        # previous batch's backward, so only the current batch holds rows.
        self.window = 1
        self.step = 0
        self.id_map = IdMap(self.capacity)
        self.register_buffer("slot_ids", torch.full((self.capacity,), -1, dtype=torch.int64))
        self.register_buffer("last_used", torch.full((self.capacity,), NEVER_USED, dtype=torch.int64))
        # Batches in flight (prefetched, or in compute) pin their rows; a row is evictable only at zero pins.
        self.register_buffer("pins", torch.zeros(self.capacity, dtype=torch.int32), persistent=False)
        self.eviction, self.admission, self.cadence = self._new_policies()
        self.counters: Dict[str, int] = dict.fromkeys(COUNTERS, 0)

    def _new_policies(self) -> Tuple[Optional[EvictionPolicy], Optional[AdmissionPolicy], Optional[EvictionCadence]]:
        """Fresh eviction, admission and cadence objects from the spec (None where the table has none)."""
        from torchrec_ascend.policies.cadence import EvictionCadence
        from torchrec_ascend.policies.registry import create_admission_policy, create_eviction_policy

        spec, evicts = self.spec, self.overflow == "evict"
        if self.refuse_unused:
            refuse_unused_eviction_settings(self.table, spec, self.overflow)
        try:
            eviction = create_eviction_policy(spec.eviction_policy, self.capacity, **dict(spec.eviction_options)) \
                if evicts else None
            admission = create_admission_policy(spec.admission_policy, **dict(spec.admission_options)) \
                if spec.admission_policy else None
            cadence = EvictionCadence(self.capacity, **dict(spec.eviction_cadence)) if evicts else None
        except ConfigError as err:
            raise ConfigError(f"table {self.table!r}: {err}") from err
        return eviction, admission, cadence

    def __len__(self) -> int:
        return len(self.id_map)

    def assign(
        self,
        ids: torch.Tensor,
        training: bool,
        known: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        signals: Optional[Dict[str, torch.Tensor]] = None,
        on_evict: Optional[Callable[[torch.Tensor, torch.Tensor], None]] = None,
    ) -> Assignment:
        """Rows for a batch of this table's IDs (one call per table per batch).

        Args:
            ids: int64 ``[n]`` raw IDs, non-negative (the caller has checked, naming the feature).
            training: insert new IDs (True) or only look up, mapping unknown IDs to the default row (False).
            known: for a cache, tells which IDs missing from the pool exist in a lower tier (those bypass
                admission: they already have a row; in eval mode they are still brought into the pool); None means
                none do.
            signals: optional per-ID tensors aligned with ``ids`` (e.g. ``"clicks"``) for the policies.
            on_evict: called with ``(slots, ids)`` of the rows about to be freed, before the map changes (a cache
                writes them back here; if it raises, the map is unchanged).

        Raises:
            CapacityError: the pool is full and the overflow rule is ``"error"``, or the batch (with the pinned
                in-flight batches) needs more rows than the pool has.
        """
        if training and self.admission is None and self.eviction is None and known is None:
            return self._insert_all(ids)
        self.counters["lookups"] += ids.numel()
        unique, inverse, counts = ops.hash_unique(ids)
        slots_u = self.id_map.lookup(unique)
        hit = slots_u >= 0
        # Positions, then index_select / index_copy_ / index_fill_: a boolean mask index is a nonzero per use, and an
        # index_put of a scalar costs 4x an index_fill_ (this path runs per table per batch).
        hit_pos, missing = hit.nonzero().squeeze(1), (~hit).nonzero().squeeze(1)
        hit_counts = counts.index_select(0, hit_pos)
        self.counters["hits"] += int(hit_counts.sum())
        if not training and known is None:
            self.counters["unknown_in_eval"] += missing.numel()
            return Assignment(slots=torch.where(hit, slots_u, self.default_slot).index_select(0, inverse),
                              default_used=bool(missing.numel()))

        self.step += 1
        hit_slots = slots_u.index_select(0, hit_pos)
        self.last_used.index_fill_(0, hit_slots, self.step)
        missing_ids = unique.index_select(0, missing)
        admitted: Optional[torch.Tensor] = None  # None: every missing ID gets a row
        if not training:  # eval with lower tiers: bring their rows in, insert nothing new
            admitted = known(missing_ids)  # type: ignore[misc]  # not None: eval without it returned above
            self.counters["unknown_in_eval"] += int(missing.numel() - admitted.sum())
        elif self.admission is not None:
            admitted = self._admit(missing_ids, counts.index_select(0, missing), known,
                                   _select(signals, inverse, missing))
        if admitted is None or bool(admitted.all()):
            new_pos, new_ids = missing, missing_ids
        else:
            new_pos, new_ids = missing[admitted], missing_ids[admitted]
        if training:
            self.counters["rejected"] += int(missing.numel() - new_pos.numel())

        evicted_slots, evicted_ids = self._make_room(new_ids.numel(), on_evict)
        new_slots, _ = self.id_map.insert_or_lookup(new_ids)
        self.slot_ids.index_copy_(0, new_slots, new_ids)
        self.last_used.index_fill_(0, new_slots, self.step)
        slots_u.index_copy_(0, new_pos, new_slots)
        default_used = hit_pos.numel() + new_pos.numel() < unique.numel()
        if default_used:
            slots_u.masked_fill_(slots_u < 0, self.default_slot)
        self.counters["inserted"] += new_ids.numel()
        if self.eviction is not None:
            self.eviction.on_insert(new_slots, new_ids, self.step, counts=counts.index_select(0, new_pos))
            self.cadence.on_insert(new_slots, self.step)  # type: ignore[union-attr]  # cadence exists whenever eviction does
            self.eviction.on_access(hit_slots, unique.index_select(0, hit_pos), hit_counts, self.step)
        return Assignment(
            slots=slots_u.index_select(0, inverse),
            new_slots=new_slots,
            new_ids=new_ids,
            evicted_slots=evicted_slots,
            evicted_ids=evicted_ids,
            default_used=default_used,
        )

    def pin(self, slots: torch.Tensor, delta: int = 1) -> None:
        """Pin (``delta=1``) or release (``-1``) distinct ``slots`` for a batch in flight."""
        self.pins[slots] += delta

    def can_fit(self, ids: torch.Tensor) -> bool:
        """Whether :meth:`assign` of ``ids`` in training would find rows now (read-only; pins respected)."""
        unique = ops.hash_unique(ids)[0]
        slots = self.id_map.lookup(unique)
        missing = int((slots < 0).sum())
        free = self.capacity - len(self.id_map)
        if missing <= free:
            return True
        evictable = (self.last_used <= self.step + 1 - self.window) & (self.slot_ids >= 0) & (self.pins == 0)
        evictable[slots[slots >= 0]] = False  # the batch's own rows stay
        return missing <= free + int(evictable.sum())

    def _insert_all(self, ids: torch.Tensor) -> Assignment:
        """The common case (every new ID admitted, a full table an error) in one native pass over the batch, which
        also stamps the last-use step and counts the hits (each tensor op over a batch's IDs costs 5-50 us here, a
        visible share of a step)."""
        self.step += 1
        slots, new_pos, hits = self.id_map.insert_stamped(ids, self.last_used, self.step)
        new_ids, new_slots = ids.index_select(0, new_pos), slots.index_select(0, new_pos)
        self.counters["lookups"] += ids.numel()
        self.counters["hits"] += hits
        # A refused ID (slot -1: the map ran full) is neither a hit nor new; the map is then full.
        if hits + new_pos.numel() < ids.numel() and len(self.id_map) == self.capacity and int(slots.min()) < 0:
            self.id_map.remove(new_ids)  # the batch fails whole: no ID keeps a row it never had filled
            needed = new_ids.numel() + ops.hash_unique(ids[slots < 0])[0].numel()
            raise self._full(needed, self.capacity - len(self.id_map))
        self.slot_ids.index_copy_(0, new_slots, new_ids)
        self.counters["inserted"] += new_ids.numel()
        return Assignment(slots=slots, new_slots=new_slots, new_ids=new_ids, default_used=False)  # full: raised

    def remove(self, ids: torch.Tensor) -> torch.Tensor:
        """Drop IDs from the pool (e.g. expired ones); returns their freed rows (-1 where absent)."""
        freed = self.id_map.remove(ids)
        gone = freed[freed >= 0]
        self._note_left(ids[freed >= 0])
        self.slot_ids[gone] = -1
        if self.eviction is not None and gone.numel():
            self.eviction.on_remove(gone)
            self.cadence.on_remove(gone)  # type: ignore[union-attr]  # cadence exists whenever eviction does
        return freed

    def stats(self) -> Dict[str, int]:
        """Counters since creation plus the current size and capacity."""
        return {**self.counters, "size": len(self), "capacity": self.capacity}

    def get_extra_state(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {"step": self.step, "counters": dict(self.counters)}
        if self.eviction is not None:
            state["eviction"] = self.eviction.state_dict()
            state["cadence"] = self.cadence.state_dict()  # type: ignore[union-attr]  # cadence exists whenever eviction does
        if self.admission is not None:
            state["admission"] = self.admission.state_dict()
        return state

    def set_extra_state(self, state: Dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.counters.update(state["counters"])
        if self.eviction is not None and "eviction" in state:
            self.eviction.load_state_dict(state["eviction"])
            if "cadence" in state:
                self.cadence.load_state_dict(state["cadence"])  # type: ignore[union-attr]  # cadence exists whenever eviction does
        if self.admission is not None and "admission" in state:
            self.admission.load_state_dict(state["admission"])

    # -- checkpoint support (torchrec_ascend.checkpoint) -------------------------------------------------------------
    # A checkpoint saves the held IDs with their slots and last use, plus checkpoint_state(); restore() puts them back
    # exactly (same layout) or at new slots (resharding). Incremental saves need what changed since the previous
    # save: slots used since then (last_used says) and IDs that left the pool, noted once a checkpoint has marked the
    # table (8 bytes per ID that left, deduplicated as the list grows). Nothing here runs per batch except
    # _note_left, which is a no-op until the table is marked.

    _mark_step: Optional[int] = None  # slots used after this step changed since the mark; None: not tracking
    _mark_token: Optional[str] = None  # the checkpoint the mark belongs to
    _left: Optional[List[torch.Tensor]] = None  # IDs that left the pool since the mark
    _left_size = 0

    def held(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every held ID, its slot and the step it was last used at, sorted by slot.

        Returns:
            Tuple[Tensor, Tensor, Tensor]: ``ids``, ``slots``, ``last_used``, int64 ``[len(self)]``.

        Example::

            ids, slots, last_used = table.held()
        """
        ids, slots = self.id_map.export()
        return ids, slots, self.last_used[slots]

    def checkpoint_state(self) -> Dict[str, Any]:
        """What a checkpoint needs besides the per-ID records, for an exact restore.

        Returns:
            Dict[str, Any]: ``step`` (int), ``counters`` (dict), ``next_fresh`` (int) and ``free_slots`` (int64
            ``[num_free]``, the ID map's free-slot stack, so slots are handed out again in the same order), and the
            ``eviction`` / ``admission`` policies' state dicts (``{}`` for a table without that policy).

        Example::

            state = table.checkpoint_state()
            state["step"], state["eviction"].keys()
        """
        next_fresh, num_free = self.id_map.counters.tolist()
        return {
            "step": self.step,
            "counters": dict(self.counters),
            "next_fresh": next_fresh,
            "free_slots": self.id_map.free_slots[:num_free].clone(),
            "eviction": self.eviction.state_dict() if self.eviction is not None else {},
            "cadence": self.cadence.state_dict() if self.cadence is not None else {},
            "admission": self.admission.state_dict() if self.admission is not None else {},
        }

    def restore(
        self,
        ids: torch.Tensor,
        slots: torch.Tensor,
        last_used: torch.Tensor,
        state: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Become a table holding exactly ``ids`` at ``slots`` (whatever it held before is forgotten).

        Args:
            ids: int64 ``[n]`` distinct raw IDs.
            slots: int64 ``[n]`` distinct slots in ``[0, capacity)``.
            last_used: int64 ``[n]``, the step each ID was last used at.
            state: keys of :meth:`checkpoint_state`, each optional: ``step`` and ``counters`` (default 0);
                ``next_fresh`` with ``free_slots`` (default: the free slots :meth:`IdMap.from_export` leaves);
                ``eviction`` / ``admission`` policy state dicts. Without a policy's state the policy starts fresh
                and, for eviction, is told every restored ID was inserted at ``step``.

        Raises:
            CapacityError: more IDs than the table holds.
            ValueError: repeated IDs or slots, or slots out of range (from :meth:`IdMap.from_export`).
            StorageError: ``next_fresh`` / ``free_slots`` do not match the IDs.
            ConfigError: a policy state does not fit this table's policy.

        Example::

            table.restore(torch.tensor([7, 42]), torch.tensor([0, 1]), torch.tensor([3, 5]), {"step": 5})
        """
        state = state or {}
        if ids.numel() > self.capacity:
            raise CapacityError(
                f"table {self.table!r}: {ids.numel()} IDs to restore into a shard that holds {self.capacity}; raise "
                "num_embeddings (or the cache load_factor), or load with more ranks"
            )
        eviction, admission, cadence = self._new_policies()  # before any change: a bad spec leaves the table as is
        self.id_map = IdMap.from_export(ids, slots, self.capacity)
        if "next_fresh" in state:
            free, next_fresh = state["free_slots"], int(state["next_fresh"])
            if next_fresh - free.numel() != ids.numel() or not 0 <= next_fresh <= self.capacity:
                raise StorageError(
                    f"table {self.table!r}: the saved ID map says {next_fresh} slots handed out and {free.numel()} "
                    f"free, but {ids.numel()} IDs are held; the checkpoint is inconsistent"
                )
            self.id_map.free_slots[: free.numel()] = free
            self.id_map.counters.copy_(torch.tensor([next_fresh, free.numel()]))
        self.slot_ids.fill_(-1)
        self.slot_ids[slots] = ids
        self.last_used.fill_(NEVER_USED)
        self.last_used[slots] = last_used
        self.step = int(state.get("step", 0))
        self.counters = {**dict.fromkeys(COUNTERS, 0), **state.get("counters", {})}
        self.eviction, self.admission, self.cadence = eviction, admission, cadence
        if self.eviction is not None and self.cadence is not None:
            if state.get("eviction"):
                self.eviction.load_state_dict(state["eviction"])
            elif ids.numel():
                self.eviction.on_insert(slots, ids, self.step)
            if state.get("cadence"):
                self.cadence.load_state_dict(state["cadence"])
            elif ids.numel():
                self.cadence.on_insert(slots, self.step)
        if self.admission is not None and state.get("admission"):
            self.admission.load_state_dict(state["admission"])
        self._mark_step = self._mark_token = self._left = None
        self._left_size = 0

    def mark_checkpoint(self, token: Optional[str]) -> None:
        """Start (or restart) tracking changes for the next incremental save, against checkpoint ``token``.

        Rows of the in-flight batches a pipeline pins (the window less the current batch) count as changed until
        they leave the window: their backward may still be ahead.

        Example::

            table.mark_checkpoint("3f2a...")   # after a save or an exact load
        """
        self._mark_step = self.step - self.window + 1
        self._mark_token = token
        self._left, self._left_size = [], 0

    @property
    def checkpoint_mark(self) -> Optional[str]:
        """The checkpoint whose state :meth:`changes_since_mark` is relative to (None: no usable mark)."""
        return self._mark_token if self._mark_step is not None else None

    def changes_since_mark(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """What an incremental save must write: slots used since the mark, and IDs that left the pool since.

        Returns:
            Tuple[Tensor, Tensor]: int64 held ``slots`` used since the mark, and the distinct ``ids`` that left
            the pool since the mark and are not held now (dropped, or written to a lower tier).

        Raises:
            RuntimeError: the table was never marked (save or load a full checkpoint first).

        Example::

            slots, left = table.changes_since_mark()
        """
        if self._mark_step is None or self._left is None:
            # builtin: an internal invariant, the Saver checks checkpoint_mark first (no mark: a full save)
            raise RuntimeError(f"table {self.table!r}: no checkpoint mark; an incremental save needs a full one first")
        used = ((self.last_used > self._mark_step) & (self.slot_ids >= 0)).nonzero().squeeze(1)
        left = torch.unique(torch.cat(self._left)) if self._left else _EMPTY
        return used, left[self.id_map.lookup(left) < 0]

    def _note_left(self, ids: torch.Tensor) -> None:
        if self._left is None or not ids.numel():
            return
        self._left.append(ids.clone())
        self._left_size += ids.numel()
        if self._left_size > max(self.capacity, 1 << 16):  # keep the list near the number of distinct IDs
            self._left = [torch.unique(torch.cat(self._left))]
            self._left_size = self._left[0].numel()

    def _admit(
        self,
        candidates: torch.Tensor,
        counts: torch.Tensor,
        known: Optional[Callable[[torch.Tensor], torch.Tensor]],
        signals: Optional[Dict[str, torch.Tensor]],
    ) -> torch.Tensor:
        assert self.admission is not None  # assign admits every candidate of a table without admission
        admitted = known(candidates) if known is not None else torch.zeros(candidates.shape, dtype=torch.bool)
        fresh = ~admitted
        if fresh.any():
            fresh_signals = {k: v[fresh] for k, v in signals.items()} if signals else None
            admitted[fresh] = self.admission.admit(candidates[fresh], counts[fresh], self.step, fresh_signals)
        return admitted

    def _full(self, needed: int, free: int) -> CapacityError:
        return CapacityError(
            f"hash table {self.table!r} is full: a shard holds {self.capacity} IDs and this batch brings "
            f"{needed} new ones ({free} rows free). Raise num_embeddings, or set overflow='evict' to let the "
            f"eviction policy ({self.spec.eviction_policy!r}) free rows."
        )

    def _make_room(self, needed: int, on_evict: Optional[Callable[[torch.Tensor, torch.Tensor], None]]) -> tuple:
        free = self.capacity - len(self.id_map)
        due = self.cadence is not None and self.cadence.due(self.step)
        expired = self.eviction.expired(self.step) if due else _EMPTY  # type: ignore[union-attr]  # due: has a cadence, so eviction
        bulk = due and (expired.numel() > 0 or self.cadence.headroom > 0)  # type: ignore[union-attr]  # due: has a cadence
        if needed <= free and not bulk:
            return _EMPTY, _EMPTY
        if self.overflow == "error":
            raise self._full(needed, free)
        assert self.eviction is not None and self.cadence is not None
        evictable = (self.last_used <= self.step - self.window) & (self.slot_ids >= 0) & (self.pins == 0)
        if expired.numel():
            expired = expired[evictable[expired]]  # rows of the current batch stay, expired or not
            evictable[expired] = False
        available = int(evictable.sum())
        if needed > free + expired.numel() + available:
            raise CapacityError(
                f"table {self.table!r}: this batch needs {needed} more rows but only {free} are free and "
                f"{expired.numel() + available} can be evicted ({self.capacity} rows per shard, rows of the last "
                f"{self.window} batch(es) pinned). Raise num_embeddings or the cache load_factor, or lower the batch "
                "size."
            )
        num = self.cadence.num_to_evict(free + expired.numel(), needed, available, self.step)
        victims = self.cadence.select(self.eviction, num, evictable, self.step)
        if expired.numel():
            victims = torch.cat([expired, victims])
        if not victims.numel():
            return _EMPTY, _EMPTY
        victim_ids = self.slot_ids.index_select(0, victims)
        if on_evict is not None:
            on_evict(victims, victim_ids)
        self.id_map.remove(victim_ids)
        self._note_left(victim_ids)
        self.eviction.on_remove(victims)
        self.cadence.on_remove(victims)
        if self.admission is not None:
            self.admission.forget(victim_ids)
        self.slot_ids.index_fill_(0, victims, -1)
        self.counters["evicted"] += victims.numel()
        return victims, victim_ids


def _select(
    signals: Optional[Dict[str, torch.Tensor]], inverse: torch.Tensor, positions: torch.Tensor
) -> Optional[Dict[str, torch.Tensor]]:
    """Per-unique-ID signals (summed over duplicates) at ``positions`` of the unique IDs."""
    if not signals:
        return None
    out = {}
    for name, values in signals.items():
        per_unique = torch.zeros(int(inverse.max()) + 1 if inverse.numel() else 0, dtype=values.dtype)
        per_unique.index_add_(0, inverse, values)
        out[name] = per_unique[positions]
    return out

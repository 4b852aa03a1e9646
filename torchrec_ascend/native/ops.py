"""Python entry points of the native ops ``torch.ops.torchrec_ascend.*`` and their fake (shape-only) kernels.

Importing this module loads ``torchrec_ascend.native._C``, whose static initialisers register the schema
(``kernels/csrc/schema.cpp``) and the CPU kernels. The fake kernels below let the ops run under ``FakeTensorMode``,
on the ``meta`` device and inside ``torch.compile``. :mod:`torchrec_ascend.native.reference` holds plain-Python
versions with the same semantics, used as test oracles.

All ID inputs are 1-D int64 CPU tensors. Errors: a wrong dtype raises ``TypeError``, a wrong shape or value (for
example a negative ID given to an ID map op) raises ``ValueError`` naming the op, the argument and the offending value.

The ID map ops work on the state tensors of :class:`torchrec_ascend.hash.id_map.IdMap` (use that class; the
functions here are its building blocks): ``buckets`` int64 ``[num_buckets, 2]`` (key, slot; key -1 = empty;
num_buckets a power of two larger than the capacity), ``free_slots`` int64 ``[capacity]`` (a stack) and ``counters``
int64 ``[2]`` (next_fresh, num_free).

The key index ops work in place on the arrays of the KEY_VALUE stores' indexes
(:mod:`torchrec_ascend.kernels.key_value.key_index`, which documents the layout): ``buckets`` ``[partitions *
stride]``, int32 (the bits of a uint32 ``slot + 1``) for ``key_index_*`` and int64 (the bits of a uint64
``fingerprint << location_bits | location + 1``) for ``fingerprint_*``, 0 empty, all ones a tombstone; ``sizes``,
``live`` and ``used`` int64 ``[partitions]``. They never copy more than one partition. Their bucket layout is no
contract (checkpoints hold keys and rows, never buckets), so their oracle is not a reference op but a dict model of
the map they keep (``tests/kernels/key_value/test_key_index*.py``).

``read_records`` gathers fixed-size records by offset from open file descriptors for the KEY_VALUE disk tier
(:func:`torchrec_ascend.kernels.key_value.segment_file.read_records` is its caller); its oracle is the files' bytes
(``tests/kernels/key_value/test_read_records.py``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from torchrec_ascend.native import library

library.load()  # registers torch.ops.torchrec_ascend; on a torch it was not built for, says which it needs

__all__ = [
    "hash_bucketize",
    "hash_rank",
    "hash_uniform_init",
    "hash_unique",
    "id_map_export",
    "id_map_insert_or_lookup",
    "id_map_insert_stamped",
    "id_map_lookup",
    "id_map_rebuild",
    "id_map_remove",
    "fingerprint_find",
    "fingerprint_insert",
    "key_index_insert",
    "key_index_lookup",
    "key_index_pop",
    "key_index_upsert",
    "read_records",
    "select_lowest",
    "select_lowest_packed",
    "take_slots",
]

_ops = torch.ops.torchrec_ascend


def id_map_insert_or_lookup(
    buckets: torch.Tensor, free_slots: torch.Tensor, counters: torch.Tensor, ids: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Slot of every ID, inserting the absent ones in one pass (mutates ``buckets`` and ``counters``).

    New IDs take slots in order of first occurrence in ``ids``: freed slots first (most recently freed first), then
    fresh slots in increasing order. When no slot is left, an absent ID gets slot ``-1`` and is not inserted.

    Args:
        buckets (Tensor): int64 ``[num_buckets, 2]`` state, mutated.
        free_slots (Tensor): int64 ``[capacity]`` state (read: the stack's contents only change on remove).
        counters (Tensor): int64 ``[2]`` state, mutated.
        ids (Tensor): int64 ``[n]``, non-negative.

    Returns:
        Tuple[Tensor, Tensor]: ``slots`` int64 ``[n]`` (``-1`` where the map is full) and ``is_new`` bool ``[n]``
        (True at the first occurrence of each ID inserted by this call).

    Raises:
        ValueError: ``ids`` holds a negative value or is not 1-D.
        TypeError: ``ids`` is not int64.

    Example::

        slots, is_new = id_map_insert_or_lookup(m.buckets, m.free_slots, m.counters, torch.tensor([7, 3, 7]))
    """
    return _ops.id_map_insert_or_lookup(buckets, free_slots, counters, ids)


def id_map_insert_stamped(
    buckets: torch.Tensor,
    free_slots: torch.Tensor,
    counters: torch.Tensor,
    last_used: torch.Tensor,
    ids: torch.Tensor,
    step: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`id_map_insert_or_lookup` that also stamps ``step`` into ``last_used`` at every slot it maps and counts
    the IDs it found (a slot table's training pass in one call).

    Args:
        buckets, free_slots, counters: the ID map's state, as for :func:`id_map_insert_or_lookup`.
        last_used (Tensor): int64 ``[capacity]``, mutated: ``step`` at each slot of the result (``>= 0``).
        ids (Tensor): int64 ``[n]``, non-negative.
        step (int): ``>= 0``.

    Returns:
        Tuple[Tensor, Tensor, Tensor]: ``slots`` int64 ``[n]`` (``-1`` where the map is full), ``new_positions``
        int64 ``[k]`` (ascending: the first occurrence of each ID this call inserted) and ``hits`` (int64 scalar: the
        positions whose ID the map held before the call).

    Raises:
        ValueError: ``ids`` holds a negative value or is not 1-D, ``step`` is negative.
        TypeError: ``ids`` is not int64.
        RuntimeError: ``last_used`` is not int64 ``[capacity]``.

    Example::

        slots, new_positions, hits = id_map_insert_stamped(
            m.buckets, m.free_slots, m.counters, last_used, torch.tensor([7, 3, 7]), step=1)  # ..., [0, 1], 0
    """
    return _ops.id_map_insert_stamped(buckets, free_slots, counters, last_used, ids, step)


def id_map_lookup(buckets: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Slot of every ID, ``-1`` where absent (read-only).

    Args:
        buckets (Tensor): int64 ``[num_buckets, 2]`` state.
        ids (Tensor): int64 ``[n]``, non-negative.

    Returns:
        Tensor: int64 ``[n]``.

    Raises:
        ValueError: ``ids`` holds a negative value or is not 1-D.
        TypeError: ``ids`` is not int64.

    Example::

        slots = id_map_lookup(m.buckets, torch.tensor([7, 8]))
    """
    return _ops.id_map_lookup(buckets, ids)


def id_map_remove(
    buckets: torch.Tensor, free_slots: torch.Tensor, counters: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """Removes IDs and pushes their slots on the free stack (mutates all three state tensors).

    Args:
        buckets (Tensor): int64 ``[num_buckets, 2]`` state, mutated.
        free_slots (Tensor): int64 ``[capacity]`` state, mutated.
        counters (Tensor): int64 ``[2]`` state, mutated.
        ids (Tensor): int64 ``[n]``, non-negative.

    Returns:
        Tensor: int64 ``[n]``, the freed slot per ID, ``-1`` where absent (also for a repeated ID's later copies).

    Raises:
        ValueError: ``ids`` holds a negative value or is not 1-D.
        TypeError: ``ids`` is not int64.

    Example::

        freed = id_map_remove(m.buckets, m.free_slots, m.counters, torch.tensor([7]))
    """
    return _ops.id_map_remove(buckets, free_slots, counters, ids)


def id_map_export(buckets: torch.Tensor, counters: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Every ``(id, slot)`` pair held, sorted by slot.

    Args:
        buckets (Tensor): int64 ``[num_buckets, 2]`` state.
        counters (Tensor): int64 ``[2]`` state.

    Returns:
        Tuple[Tensor, Tensor]: ``ids`` and ``slots``, int64 ``[len(map)]`` each, ``slots`` strictly increasing.

    Raises:
        RuntimeError: the state is inconsistent (buckets and counters disagree).

    Example::

        ids, slots = id_map_export(m.buckets, m.counters)
    """
    return _ops.id_map_export(buckets, counters)


def id_map_rebuild(
    buckets: torch.Tensor, free_slots: torch.Tensor, counters: torch.Tensor, ids: torch.Tensor, slots: torch.Tensor
) -> None:
    """Replaces the state by one holding exactly ``ids[i] -> slots[i]`` (inverse of :func:`id_map_export`).

    ``next_fresh`` becomes ``max(slots) + 1``; the unused slots below it become the free stack, lowest handed out
    first. On a bad input nothing is changed, except for a repeated ID, which leaves the map empty.

    Args:
        buckets (Tensor): int64 ``[num_buckets, 2]`` state, overwritten.
        free_slots (Tensor): int64 ``[capacity]`` state, overwritten.
        counters (Tensor): int64 ``[2]`` state, overwritten.
        ids (Tensor): int64 ``[n]``, distinct, non-negative.
        slots (Tensor): int64 ``[n]``, distinct, in ``[0, capacity)``.

    Raises:
        ValueError: an ID is negative or repeated, a slot is repeated or out of range, or the lengths differ.

    Example::

        id_map_rebuild(m.buckets, m.free_slots, m.counters, torch.tensor([7, 3]), torch.tensor([0, 2]))
    """
    _ops.id_map_rebuild(buckets, free_slots, counters, ids, slots)


def hash_unique(ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distinct IDs in order of first occurrence (hash-based, one pass), with inverse indices and counts.

    Args:
        ids (Tensor): int64 ``[n]``, any values.

    Returns:
        Tuple[Tensor, Tensor, Tensor]: ``unique`` int64 ``[k]``, ``inverse`` int64 ``[n]`` with
        ``unique[inverse] == ids``, and ``counts`` int64 ``[k]``.

    Raises:
        ValueError: ``ids`` is not 1-D.
        TypeError: ``ids`` is not int64.

    Example::

        >>> hash_unique(torch.tensor([5, 3, 5]))
        (tensor([5, 3]), tensor([0, 1, 0]), tensor([2, 1]))
    """
    return _ops.hash_unique(ids)


def hash_rank(ids: torch.Tensor, world_size: int) -> torch.Tensor:
    """Rank that owns each ID under row-wise hash placement: ``mix64(id) % world_size`` (splitmix64 finaliser).

    Args:
        ids (Tensor): int64 ``[n]``, any values (taken as their 64-bit pattern).
        world_size (int): number of ranks, >= 1.

    Returns:
        Tensor: int64 ``[n]`` in ``[0, world_size)``.

    Raises:
        ValueError: ``world_size < 1`` or ``ids`` is not 1-D.
        TypeError: ``ids`` is not int64.

    Example::

        ranks = hash_rank(torch.tensor([1, 2, 3]), world_size=4)
    """
    return _ops.hash_rank(ids, world_size)


def hash_bucketize(
    lengths: torch.Tensor, values: torch.Tensor, weights: Optional[torch.Tensor], world_size: int
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """Splits jagged IDs into one bucket per rank by :func:`hash_rank`, in ``block_bucketize_sparse_features`` layout.

    The output matches ``torch.ops.fbgemm.block_bucketize_sparse_features(..., sequence=True, keep_orig_idx=True)``
    with the bucket of a value chosen by hash instead of by block: bucket-major lengths, each bucket's values grouped
    by segment and in input order, original IDs kept.

    Args:
        lengths (Tensor): int32/int64 ``[S]``, one length per segment (feature-major ``F * B``; variable batch sizes
            per feature are just another segment list).
        values (Tensor): int64 ``[sum(lengths)]``.
        weights (Optional[Tensor]): float ``[sum(lengths)]``, permuted like ``values``.
        world_size (int): number of buckets (ranks), >= 1.

    Returns:
        Tuple: ``new_lengths`` (dtype of lengths) ``[world_size * S]`` (bucket 0's S lengths, then bucket 1's, ...),
        ``new_values`` int64 ``[n]``, ``new_weights`` ``[n]`` or None, and ``unbucketize_permute`` int64 ``[n]``
        with ``new_values[unbucketize_permute] == values``.

    Raises:
        ValueError: a negative length, lengths not summing to the number of values, mismatched weights, or
            ``world_size < 1``.
        TypeError: ``values`` is not int64 or ``lengths`` not int32/int64.

    Example::

        new_lengths, new_values, _, permute = hash_bucketize(kjt.lengths(), kjt.values(), None, world_size=2)
    """
    return _ops.hash_bucketize(lengths, values, weights, world_size)


def hash_uniform_init(ids: torch.Tensor, seed: int, dim: int, low: float, high: float) -> torch.Tensor:
    """Initial rows that depend only on ``(seed, id, column)``: not on arrival order, world size or kernel.

    Row ``i`` is the splitmix64 stream seeded with ``mix64(ids[i] ^ mix64(seed))``; element ``j`` takes the top 24
    bits of its ``(j + 1)``-th output as ``u`` in ``[0, 1)`` and is ``float32(low + float32(high - low) * u)``,
    moved one float down if rounding reached ``high``.

    Args:
        ids (Tensor): int64 ``[n]``.
        seed (int): table seed (any int64).
        dim (int): row width, >= 0.
        low (float): inclusive lower bound.
        high (float): exclusive upper bound, ``> low``.

    Returns:
        Tensor: float32 ``[n, dim]``, values in ``[low, high)``.

    Raises:
        ValueError: ``dim < 0``, ``low >= high`` or a bound not finite.
        TypeError: ``ids`` is not int64.

    Example::

        rows = hash_uniform_init(torch.tensor([10, 11]), seed=0, dim=8, low=-0.01, high=0.01)
    """
    return _ops.hash_uniform_init(ids, seed, dim, low, high)


def key_index_lookup(
    buckets: torch.Tensor, sizes: torch.Tensor, key_column: torch.Tensor, keys: torch.Tensor
) -> torch.Tensor:
    """Slot of each key in a host-tier key index, ``-1`` where absent (read-only; repeats allowed).

    Key ``k`` lives in partition ``h & (partitions - 1)`` with ``h = mix64(k + GOLDEN)``, home bucket
    ``(h >> 32) * size >> 32``; the key of slot ``s`` is ``key_column[s]``.

    Args:
        buckets (Tensor): int32 ``[partitions * stride]``.
        sizes (Tensor): int64 ``[partitions]``, buckets in use per partition.
        key_column (Tensor): int64 ``[max_slots]``, slot -> key.
        keys (Tensor): int64 ``[n]``.

    Returns:
        Tensor: int64 ``[n]``.

    Example::

        slots = key_index_lookup(index.buckets, index.sizes, index.key_column, torch.tensor([7, 8]))
    """
    return _ops.key_index_lookup(buckets, sizes, key_column, keys)


def key_index_insert(
    buckets: torch.Tensor,
    sizes: torch.Tensor,
    live: torch.Tensor,
    used: torch.Tensor,
    key_column: torch.Tensor,
    slots: torch.Tensor,
    max_load: float,
    low_load: float,
) -> int:
    """Index ``slots`` under their keys ``key_column[slots]``, which must be distinct and absent.

    First every partition that the new keys would fill past ``max_load`` (live + tombstones) is rebuilt without
    tombstones at ``low_load``: ``max(8, ceil(keys / low_load) + 1)`` buckets; then each key, in order, takes the
    first empty or tombstone bucket from its home on, after its probe ran to the end without meeting its key.

    Args:
        buckets, sizes, live, used (Tensor): the index state, mutated.
        key_column (Tensor): int64 ``[max_slots]``, with the new keys already written at ``slots``.
        slots (Tensor): int64 ``[n]``.
        max_load, low_load (float): the load that triggers a rebuild and the load it rebuilds to.

    Returns:
        int: ``-1``; or the first partition that would need more than ``stride`` buckets (nothing changed); or
        ``-2 - i`` where ``key_column[slots[i]]`` is present or repeats an earlier key (no key is indexed, the
        partitions may have been rebuilt).

    Example::

        full = key_index_insert(*state, key_column, torch.tensor([0, 1]), 0.8, 0.8 / 1.3)
    """
    return int(_ops.key_index_insert(buckets, sizes, live, used, key_column, slots, max_load, low_load))


def key_index_upsert(
    buckets: torch.Tensor,
    sizes: torch.Tensor,
    live: torch.Tensor,
    used: torch.Tensor,
    key_column: torch.Tensor,
    free_slots: torch.Tensor,
    counts: torch.Tensor,
    stamps: torch.Tensor,
    keys: torch.Tensor,
    stamp: int,
    max_load: float,
    low_load: float,
) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """The host store's put in one pass: the slot of every key, indexing the absent ones, each slot stamped.

    Absent keys take slots in order of first occurrence: the top of ``free_slots`` first (``counts[0]`` entries),
    then fresh slots from ``counts[1]`` on; their keys are written to ``key_column``. Partitions are rebuilt first as
    :func:`key_index_insert` does, for the absent keys.

    Args:
        buckets, sizes, live, used (Tensor): the index state, mutated.
        key_column (Tensor): int64 ``[max_slots]``, slot -> key, mutated.
        free_slots (Tensor): int32 ``[max_slots]``, a stack of freed slots.
        counts (Tensor): int64 ``[3]``: slots on the stack, slots handed out, the most slots the stack has held.
        stamps (Tensor): int32, at least ``[max_slots]``, non-negative; every slot returned gets ``stamp``.
        keys (Tensor): int64 ``[n]``, repeats allowed.
        stamp (int): in ``[0, 2**31 - 1]``; no slot's stamp may equal it before the call.
        max_load, low_load (float): as :func:`key_index_insert`.

    Returns:
        Tuple[Tensor, Tensor, int]: per distinct key, its slot and the position of its last occurrence in ``keys``
        (in order of first occurrence: without repeats the positions are ``0 .. n-1``), and ``-1``; or two empty
        tensors and the first partition that would need more than ``stride`` buckets (nothing changed).

    Raises:
        RuntimeError: more keys are absent than slots are left (nothing changed): the caller makes room first.

    Example::

        slots, positions, full = key_index_upsert(*state, key_column, free, counts, stamps, keys, 7, 0.8, 0.8 / 1.3)
        rows_of_slots.index_copy_(0, slots, rows.index_select(0, positions))
    """
    slots, positions, full = _ops.key_index_upsert(
        buckets, sizes, live, used, key_column, free_slots, counts, stamps, keys, stamp, max_load, low_load
    )
    return slots, positions, int(full)


def key_index_pop(
    buckets: torch.Tensor,
    sizes: torch.Tensor,
    live: torch.Tensor,
    key_column: torch.Tensor,
    free_slots: torch.Tensor,
    counts: torch.Tensor,
    stamps: torch.Tensor,
    keys: torch.Tensor,
    free_stamp: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Find and remove keys in one pass: their buckets become tombstones, their slots go on the free stack.

    Args:
        buckets, sizes, live, key_column (Tensor): the index state (``buckets`` and ``live`` mutated).
        free_slots, counts (Tensor): as :func:`key_index_upsert`, mutated (freed slots are pushed in order).
        stamps (Tensor): int32 ``[>= max_slots]``: every freed slot gets ``free_stamp``; or empty (none kept).
        keys (Tensor): int64 ``[n]``, repeats allowed.
        free_stamp (int): an int32.

    Returns:
        Tuple[Tensor, Tensor]: the slot of every key (``-1`` where absent; a repeat gets the same slot), and the
        slots freed, one per distinct key found, in order of first occurrence. The freed slots' data stays until a
        later call hands them out again.

    Example::

        slots, freed = key_index_pop(buckets, sizes, live, key_column, free, counts, stamps, keys, 2**31 - 1)
    """
    return _ops.key_index_pop(buckets, sizes, live, key_column, free_slots, counts, stamps, keys, free_stamp)


def fingerprint_find(
    buckets: torch.Tensor,
    sizes: torch.Tensor,
    part: torch.Tensor,
    fingerprints: torch.Tensor,
    after: torch.Tensor,
    fingerprint_bits: int,
) -> torch.Tensor:
    """First bucket along each key's probe whose entry's top ``fingerprint_bits`` equal its fingerprint, or -1.

    The probe starts at the home bucket ``fingerprint * size >> fingerprint_bits`` of partition ``part[i]``, or
    just after bucket ``after[i]`` when that is >= 0 (to go on past a candidate that turned out to be another key's),
    and ends at an empty bucket.

    Args:
        buckets (Tensor): int64 ``[partitions * stride]``.
        sizes (Tensor): int64 ``[partitions]``.
        part, fingerprints, after (Tensor): int64 ``[n]``.
        fingerprint_bits (int): in ``[1, 63]``.

    Returns:
        Tensor: int64 ``[n]``, global bucket indexes.

    Example::

        candidates = fingerprint_find(buckets, sizes, part, fingerprints, torch.full_like(part, -1), 28)
    """
    return _ops.fingerprint_find(buckets, sizes, part, fingerprints, after, fingerprint_bits)


def fingerprint_insert(
    buckets: torch.Tensor,
    sizes: torch.Tensor,
    live: torch.Tensor,
    used: torch.Tensor,
    part: torch.Tensor,
    entries: torch.Tensor,
    fingerprint_bits: int,
    max_load: float,
    low_load: float,
) -> int:
    """Store ``entries`` (of absent keys, neither 0 nor all ones) in their partitions, rebuilding those that would
    pass ``max_load`` first (as :func:`key_index_insert`); the home of an entry comes from its fingerprint.

    Returns:
        int: ``-1``, or the first partition that would need more than ``stride`` buckets (nothing changed).

    Example::

        full = fingerprint_insert(buckets, sizes, live, used, part, entries, 28, 0.8, 0.8 / 1.3)
    """
    return int(
        _ops.fingerprint_insert(buckets, sizes, live, used, part, entries, fingerprint_bits, max_load, low_load)
    )


def select_lowest(scores: torch.Tensor, candidates: torch.Tensor, num: int) -> torch.Tensor:
    """Positions of the ``num`` candidates with the lowest scores (every candidate if fewer), by radix selection.

    Ties go to the lowest positions; NaN scores rank above every other score and -0.0 equals 0.0 (``torch.sort``'s
    order), so the result is the first ``num`` candidates of a stable sort by score, as a set.

    Args:
        scores (Tensor): int64 or float64 ``[n]`` (widen other dtypes first: it is exact).
        candidates (Tensor): bool ``[n]``, the positions that may be chosen.
        num (int): how many to choose, >= 0.

    Returns:
        Tensor: int64 ``[min(num, candidates.sum())]`` distinct candidate positions, in no particular order.

    Raises:
        ValueError: shapes differ or are not 1-D, or ``num < 0``.
        TypeError: ``scores`` is not int64 or float64, or ``candidates`` is not bool.

    Example::

        >>> select_lowest(torch.tensor([3, 1, 2]), torch.tensor([True, False, True]), 1)
        tensor([2])
    """
    return _ops.select_lowest(scores, candidates, num)


def select_lowest_packed(high: torch.Tensor, low: torch.Tensor, candidates: torch.Tensor, num: int) -> torch.Tensor:
    """:func:`select_lowest` of the scores ``high << 32 | low`` with ``high`` saturated into ``[0, 2**31 - 1]`` and
    ``low`` into ``[0, 2**32 - 1]`` (how the eviction policies pack two keys into one score), without building them.

    Args:
        high (Tensor): int64 ``[n]``, the first key.
        low (Tensor): int64 ``[n]``, the tie-break.
        candidates (Tensor): bool ``[n]``, the positions that may be chosen.
        num (int): how many to choose, >= 0.

    Returns:
        Tensor: int64 ``[min(num, candidates.sum())]`` distinct candidate positions, in no particular order.

    Raises:
        ValueError: shapes differ or are not 1-D, or ``num < 0``.
        TypeError: ``high`` or ``low`` is not int64, or ``candidates`` is not bool.

    Example::

        >>> select_lowest_packed(torch.tensor([1, 0, 0]), torch.tensor([0, 5, 2]), torch.tensor([True, True, False]), 1)
        tensor([1])
    """
    return _ops.select_lowest_packed(high, low, candidates, num)


def take_slots(free: torch.Tensor, slots: torch.Tensor) -> bool:
    """Clear ``free[s]`` for each of ``slots`` in turn; whether each was in ``[0, len(free))`` and still set.

    True iff ``slots`` are distinct and were all set in ``free``. It stops at the first slot that was not (the slots
    before it are cleared then): pass a scratch mask.

    Args:
        free (Tensor): bool ``[n]``, contiguous, mutated.
        slots (Tensor): int64 ``[k]``.

    Returns:
        bool: whether every slot was taken.

    Raises:
        ValueError: ``free`` or ``slots`` is not 1-D (or ``free`` not contiguous).
        TypeError: ``free`` is not bool or ``slots`` not int64.

    Example::

        >>> free = torch.tensor([True, True, False])
        >>> take_slots(free, torch.tensor([1, 0])), take_slots(free.clone(), torch.tensor([2]))
        (True, False)
    """
    return bool(_ops.take_slots(free, slots))


def read_records(fds: torch.Tensor, offsets: torch.Tensor, record_bytes: int, out: torch.Tensor) -> torch.Tensor:
    """Copy record ``i`` (``record_bytes`` bytes at ``offsets[i] * record_bytes`` of the open file descriptor
    ``fds[i]``) into row ``i`` of ``out``, announcing every record to the kernel first so that their disk reads run
    in parallel instead of one at a time.

    Args:
        fds, offsets (Tensor): int64 ``[n]``; record offsets, not byte offsets.
        record_bytes (int): bytes per record, > 0.
        out (Tensor): contiguous CPU, ``n * record_bytes`` bytes (any dtype), written in place.

    Returns:
        Tensor: int64 ``[2]``: ``(-1, 0)`` when every record was read, else ``(i, errno)`` for the first record ``i``
        (in file order) not read in full, errno 0 when the file ends before it; the rows of records after it in file
        order are not written.

    Example::

        out = torch.empty(2, 4, dtype=torch.int64)  # two records of 32 bytes
        failed, error = read_records(torch.tensor([fd, fd]), torch.tensor([7, 0]), 32, out).tolist()
    """
    return _ops.read_records(fds, offsets, record_bytes, out)


# ---- fake kernels: output shapes and dtypes only; data-dependent sizes become unbacked symbols.


@torch.library.register_fake("torchrec_ascend::id_map_insert_or_lookup")
def _id_map_insert_or_lookup_fake(
    buckets: torch.Tensor, free_slots: torch.Tensor, counters: torch.Tensor, ids: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(ids), torch.empty_like(ids, dtype=torch.bool)


@torch.library.register_fake("torchrec_ascend::id_map_insert_stamped")
def _id_map_insert_stamped_fake(
    buckets: torch.Tensor, free_slots: torch.Tensor, counters: torch.Tensor, last_used: torch.Tensor,
    ids: torch.Tensor, step: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    inserted = torch.library.get_ctx().new_dynamic_size()
    return torch.empty_like(ids), ids.new_empty(inserted), ids.new_empty(())


@torch.library.register_fake("torchrec_ascend::id_map_lookup")
def _id_map_lookup_fake(buckets: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(ids)


@torch.library.register_fake("torchrec_ascend::id_map_remove")
def _id_map_remove_fake(
    buckets: torch.Tensor, free_slots: torch.Tensor, counters: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    return torch.empty_like(ids)


@torch.library.register_fake("torchrec_ascend::id_map_export")
def _id_map_export_fake(buckets: torch.Tensor, counters: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    size = torch.library.get_ctx().new_dynamic_size()
    return buckets.new_empty(size), buckets.new_empty(size)


@torch.library.register_fake("torchrec_ascend::id_map_rebuild")
def _id_map_rebuild_fake(
    buckets: torch.Tensor, free_slots: torch.Tensor, counters: torch.Tensor, ids: torch.Tensor, slots: torch.Tensor
) -> None:
    return None


@torch.library.register_fake("torchrec_ascend::hash_unique")
def _hash_unique_fake(ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    size = torch.library.get_ctx().new_dynamic_size()
    return ids.new_empty(size), torch.empty_like(ids), ids.new_empty(size)


@torch.library.register_fake("torchrec_ascend::hash_rank")
def _hash_rank_fake(ids: torch.Tensor, world_size: int) -> torch.Tensor:
    return torch.empty_like(ids)


@torch.library.register_fake("torchrec_ascend::hash_bucketize")
def _hash_bucketize_fake(
    lengths: torch.Tensor, values: torch.Tensor, weights: Optional[torch.Tensor], world_size: int
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    new_weights = None if weights is None else torch.empty_like(weights)
    return (
        lengths.new_empty(world_size * lengths.numel()),
        torch.empty_like(values),
        new_weights,
        torch.empty_like(values),
    )


@torch.library.register_fake("torchrec_ascend::hash_uniform_init")
def _hash_uniform_init_fake(ids: torch.Tensor, seed: int, dim: int, low: float, high: float) -> torch.Tensor:
    return ids.new_empty((ids.numel(), dim), dtype=torch.float32)


@torch.library.register_fake("torchrec_ascend::key_index_lookup")
def _key_index_lookup_fake(
    buckets: torch.Tensor, sizes: torch.Tensor, key_column: torch.Tensor, keys: torch.Tensor
) -> torch.Tensor:
    return torch.empty_like(keys)


@torch.library.register_fake("torchrec_ascend::key_index_insert")
def _key_index_insert_fake(
    buckets: torch.Tensor,
    sizes: torch.Tensor,
    live: torch.Tensor,
    used: torch.Tensor,
    key_column: torch.Tensor,
    slots: torch.Tensor,
    max_load: float,
    low_load: float,
) -> torch.Tensor:
    return sizes.new_empty(())


@torch.library.register_fake("torchrec_ascend::key_index_upsert")
def _key_index_upsert_fake(
    buckets: torch.Tensor,
    sizes: torch.Tensor,
    live: torch.Tensor,
    used: torch.Tensor,
    key_column: torch.Tensor,
    free_slots: torch.Tensor,
    counts: torch.Tensor,
    stamps: torch.Tensor,
    keys: torch.Tensor,
    stamp: int,
    max_load: float,
    low_load: float,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    distinct = torch.library.get_ctx().new_dynamic_size()
    return keys.new_empty(distinct), keys.new_empty(distinct), sizes.new_empty(())


@torch.library.register_fake("torchrec_ascend::key_index_pop")
def _key_index_pop_fake(
    buckets: torch.Tensor,
    sizes: torch.Tensor,
    live: torch.Tensor,
    key_column: torch.Tensor,
    free_slots: torch.Tensor,
    counts: torch.Tensor,
    stamps: torch.Tensor,
    keys: torch.Tensor,
    free_stamp: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(keys), keys.new_empty(torch.library.get_ctx().new_dynamic_size())


@torch.library.register_fake("torchrec_ascend::fingerprint_find")
def _fingerprint_find_fake(
    buckets: torch.Tensor,
    sizes: torch.Tensor,
    part: torch.Tensor,
    fingerprints: torch.Tensor,
    after: torch.Tensor,
    fingerprint_bits: int,
) -> torch.Tensor:
    return torch.empty_like(part)


@torch.library.register_fake("torchrec_ascend::select_lowest")
def _select_lowest_fake(scores: torch.Tensor, candidates: torch.Tensor, num: int) -> torch.Tensor:
    return scores.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.int64)


@torch.library.register_fake("torchrec_ascend::select_lowest_packed")
def _select_lowest_packed_fake(
    high: torch.Tensor, low: torch.Tensor, candidates: torch.Tensor, num: int
) -> torch.Tensor:
    return high.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.int64)


@torch.library.register_fake("torchrec_ascend::take_slots")
def _take_slots_fake(free: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    return free.new_empty(())


@torch.library.register_fake("torchrec_ascend::read_records")
def _read_records_fake(fds: torch.Tensor, offsets: torch.Tensor, record_bytes: int, out: torch.Tensor) -> torch.Tensor:
    return fds.new_empty(2)


@torch.library.register_fake("torchrec_ascend::fingerprint_insert")
def _fingerprint_insert_fake(
    buckets: torch.Tensor,
    sizes: torch.Tensor,
    live: torch.Tensor,
    used: torch.Tensor,
    part: torch.Tensor,
    entries: torch.Tensor,
    fingerprint_bits: int,
    max_load: float,
    low_load: float,
) -> torch.Tensor:
    return sizes.new_empty(())

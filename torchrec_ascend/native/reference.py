"""Plain-Python references of the native ops in :mod:`torchrec_ascend.native.ops`, bit for bit.

These are the test oracles: written for obviousness (dicts, lists, Python ints), not speed, and free of any code
shared with the C++ kernels. They also document the exact bits of :func:`hash_rank` and :func:`hash_uniform_init`,
which are part of the contract (row placement across ranks, initial rows, checkpoints).

Example::

    from torchrec_ascend.native import reference
    assert reference.hash_rank(torch.tensor([1, 2]), 4).tolist() == [reference.mix64(1) % 4, reference.mix64(2) % 4]
"""

from __future__ import annotations

import math
import struct
from typing import Dict, List, Optional, Tuple

import torch

from torchrec_ascend.errors import ConfigError

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's Weyl increment
NOT_FOUND = -1

__all__ = [
    "IdMapReference",
    "hash_bucketize",
    "hash_rank",
    "hash_uniform_init",
    "hash_unique",
    "mix64",
    "select_lowest",
    "select_lowest_packed",
    "take_slots",
]


def mix64(x: int) -> int:
    """splitmix64 finaliser of the 64-bit pattern of ``x`` (a bijection on ``[0, 2**64)``).

    Args:
        x (int): any Python int; only its low 64 bits (two's complement) count.

    Returns:
        int: in ``[0, 2**64)``.

    Example::

        >>> mix64(0)
        0
    """
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def hash_rank(ids: torch.Tensor, world_size: int) -> torch.Tensor:
    """Reference of :func:`torchrec_ascend.native.ops.hash_rank`: ``mix64(id) % world_size`` per ID.

    Args:
        ids (Tensor): int64 ``[n]``.
        world_size (int): >= 1.

    Returns:
        Tensor: int64 ``[n]``.

    Example::

        ranks = hash_rank(torch.tensor([1, 2, 3]), 4)
    """
    return torch.tensor([mix64(i) % world_size for i in ids.tolist()], dtype=torch.int64)


def hash_unique(ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference of :func:`torchrec_ascend.native.ops.hash_unique` (a dict keeps first-occurrence order).

    Args:
        ids (Tensor): int64 ``[n]``.

    Returns:
        Tuple[Tensor, Tensor, Tensor]: ``unique`` ``[k]``, ``inverse`` ``[n]``, ``counts`` ``[k]``, all int64.

    Example::

        unique, inverse, counts = hash_unique(torch.tensor([5, 3, 5]))
    """
    index: Dict[int, int] = {}
    counts: List[int] = []
    inverse = []
    for i in ids.tolist():
        if i not in index:
            index[i] = len(index)
            counts.append(0)
        counts[index[i]] += 1
        inverse.append(index[i])
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.int64)
    return as_tensor(list(index)), as_tensor(inverse), as_tensor(counts)


def hash_bucketize(
    lengths: torch.Tensor, values: torch.Tensor, weights: Optional[torch.Tensor], world_size: int
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """Reference of :func:`torchrec_ascend.native.ops.hash_bucketize`.

    Args:
        lengths (Tensor): int ``[S]``.
        values (Tensor): int64 ``[sum(lengths)]``.
        weights (Optional[Tensor]): float ``[sum(lengths)]``.
        world_size (int): >= 1.

    Returns:
        Tuple: ``new_lengths`` ``[world_size * S]``, ``new_values``, ``new_weights`` (or None),
        ``unbucketize_permute``.

    Example::

        new_lengths, new_values, _, permute = hash_bucketize(torch.tensor([2]), torch.tensor([4, 5]), None, 2)
    """
    # buckets[r][s] = input positions of segment s that rank r owns, in input order
    buckets: List[List[List[int]]] = [[[] for _ in lengths] for _ in range(world_size)]
    position = 0
    for s, length in enumerate(lengths.tolist()):
        for i in range(position, position + length):
            buckets[mix64(int(values[i])) % world_size][s].append(i)
        position += length
    order = [i for per_rank in buckets for per_segment in per_rank for i in per_segment]
    permute = [0] * len(order)
    for new_position, i in enumerate(order):
        permute[i] = new_position
    new_lengths = torch.tensor([len(p) for per_rank in buckets for p in per_rank], dtype=lengths.dtype)
    order_t = torch.tensor(order, dtype=torch.int64)
    new_weights = None if weights is None else weights[order_t]
    return new_lengths, values[order_t], new_weights, torch.tensor(permute, dtype=torch.int64)


def _to_float32(x: float) -> float:
    """Rounds a double to the nearest float32 (ties to even), as a C++ ``static_cast<float>`` does."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _float32_below(x: float) -> float:
    """The largest float32 strictly below the float32 ``x``."""
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    if x > 0:
        bits -= 1
    elif x < 0:
        bits += 1
    else:
        bits = 0x80000001  # below +-0 is the smallest negative subnormal
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def hash_uniform_init(ids: torch.Tensor, seed: int, dim: int, low: float, high: float) -> torch.Tensor:
    """Reference of :func:`torchrec_ascend.native.ops.hash_uniform_init`, same bits.

    Args:
        ids (Tensor): int64 ``[n]``.
        seed (int): any int64.
        dim (int): >= 0.
        low (float): inclusive bound.
        high (float): exclusive bound, ``> low``.

    Returns:
        Tensor: float32 ``[n, dim]``.

    Raises:
        ConfigError: ``dim < 0``, ``low >= high``, or a bound (or their distance) not finite in float32 (a
            ValueError, as the native op raises).

    Example::

        rows = hash_uniform_init(torch.tensor([10, 11]), seed=0, dim=4, low=-1.0, high=1.0)
    """
    scale = _to_float32(high - low)
    if dim < 0 or not (math.isfinite(low) and math.isfinite(high) and low < high and math.isfinite(scale)):
        raise ConfigError(
            f"hash_uniform_init: the rows' init range needs dim >= 0 and finite low < high (weight_init_min < "
            f"weight_init_max), got {dim=}, {low=}, {high=}"
        )
    seed_mix = mix64(seed)
    rows = []
    for i in ids.tolist():
        state = mix64(i ^ seed_mix)
        row = []
        for j in range(dim):
            u = (mix64(state + (j + 1) * GOLDEN) >> 40) * 2.0**-24
            r = _to_float32(low + scale * u)  # scale * u is exact: 24-bit times 24-bit mantissa
            row.append(_float32_below(r) if r >= high else r)
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), dim)


def select_lowest(scores: torch.Tensor, candidates: torch.Tensor, num: int) -> torch.Tensor:
    """Reference of :func:`torchrec_ascend.native.ops.select_lowest`: the first ``num`` candidates sorted by
    (score, position), NaN last and -0.0 equal to 0.0 (Python's ``sorted`` on plain numbers).

    Args:
        scores (Tensor): int64 or float64 ``[n]``.
        candidates (Tensor): bool ``[n]``.
        num (int): >= 0.

    Returns:
        Tensor: int64 ``[min(num, candidates.sum())]``, sorted by (score, position).

    Example::

        select_lowest(torch.tensor([3, 1, 2]), torch.tensor([True, False, True]), 1)  # tensor([2])
    """
    values = scores.tolist()
    positions = [i for i, flag in enumerate(candidates.tolist()) if flag]
    ranked = sorted(positions, key=lambda i: (values[i] != values[i], values[i] if values[i] == values[i] else 0, i))
    return torch.tensor(ranked[:num], dtype=torch.int64)


def select_lowest_packed(high: torch.Tensor, low: torch.Tensor, candidates: torch.Tensor, num: int) -> torch.Tensor:
    """Reference of :func:`torchrec_ascend.native.ops.select_lowest_packed`: the first ``num`` candidates sorted by
    (saturated high, saturated low, position).

    Example::

        select_lowest_packed(torch.tensor([1, 0]), torch.tensor([0, 5]), torch.tensor([True, True]), 1)  # [1]
    """
    def saturated(values: List[int], most: int) -> List[int]:
        return [min(max(v, 0), most) for v in values]

    key = list(zip(saturated(high.tolist(), 2**31 - 1), saturated(low.tolist(), 2**32 - 1)))
    positions = [i for i, flag in enumerate(candidates.tolist()) if flag]
    return torch.tensor(sorted(positions, key=lambda i: (key[i], i))[:num], dtype=torch.int64)


def take_slots(free: torch.Tensor, slots: torch.Tensor) -> bool:
    """Reference of :func:`torchrec_ascend.native.ops.take_slots`, on Python lists.

    Example::

        take_slots(torch.tensor([True, True]), torch.tensor([1, 1]))  # False: slot 1 twice
    """
    flags = free.tolist()
    for s in slots.tolist():
        if not 0 <= s < len(flags) or not flags[s]:
            free.copy_(torch.tensor(flags, dtype=torch.bool))
            return False
        flags[s] = False
    free.copy_(torch.tensor(flags, dtype=torch.bool))
    return True


class IdMapReference:
    """Reference of :class:`torchrec_ascend.hash.id_map.IdMap` on a dict, with the same slot assignment rule.

    New IDs of one call take slots in order of first occurrence: freed slots first (most recently freed first),
    then fresh slots in increasing order; ``-1`` (and not inserted) when none is left.

    Args:
        capacity (int): number of slots.

    Example::

        ref = IdMapReference(4)
        slots, is_new = ref.insert_or_lookup(torch.tensor([9, 9, 2]))  # [0, 0, 1], [True, False, True]
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.slot_of: Dict[int, int] = {}
        self.free: List[int] = []  # a stack: pop() takes the most recently freed
        self.next_fresh = 0

    def __len__(self) -> int:
        return len(self.slot_of)

    def insert_or_lookup(self, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Slots (``-1`` where full) and whether each position inserted its ID."""
        slots, is_new = [], []
        for i in ids.tolist():
            new = i not in self.slot_of
            if new:
                if self.free:
                    self.slot_of[i] = self.free.pop()
                elif self.next_fresh < self.capacity:
                    self.slot_of[i] = self.next_fresh
                    self.next_fresh += 1
            slots.append(self.slot_of.get(i, NOT_FOUND))
            is_new.append(new and i in self.slot_of)
        return torch.tensor(slots, dtype=torch.int64), torch.tensor(is_new, dtype=torch.bool)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Slots, ``-1`` where absent."""
        return torch.tensor([self.slot_of.get(i, NOT_FOUND) for i in ids.tolist()], dtype=torch.int64)

    def remove(self, ids: torch.Tensor) -> torch.Tensor:
        """Freed slots, ``-1`` where absent."""
        freed = []
        for i in ids.tolist():
            slot = self.slot_of.pop(i, NOT_FOUND)
            if slot != NOT_FOUND:
                self.free.append(slot)
            freed.append(slot)
        return torch.tensor(freed, dtype=torch.int64)

    def export(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(ids, slots)`` sorted by slot."""
        pairs = sorted(self.slot_of.items(), key=lambda kv: kv[1])
        return (
            torch.tensor([k for k, _ in pairs], dtype=torch.int64),
            torch.tensor([s for _, s in pairs], dtype=torch.int64),
        )

    @classmethod
    def from_export(cls, ids: torch.Tensor, slots: torch.Tensor, capacity: int) -> "IdMapReference":
        """A map holding ``ids[i] -> slots[i]``; unused slots below ``max(slots) + 1`` are free, lowest first."""
        ref = cls(capacity)
        ref.slot_of = dict(zip(ids.tolist(), slots.tolist()))
        ref.next_fresh = max(slots.tolist(), default=-1) + 1
        used = set(ref.slot_of.values())
        ref.free = [s for s in range(ref.next_fresh - 1, -1, -1) if s not in used]
        return ref

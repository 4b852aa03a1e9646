"""Plain-Python reference models of the built-in eviction policies' rankings, and a tee that checks against them.

A reference keeps per-slot metadata in dicts, updated by the same events as the policy under test, and says what
each slot's score is. The tee forwards every call to the real policy and checks each answer against the model:
victims must be among the lowest-scoring candidates (ties allowed), expired slots must be exactly the model's.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Set

import torch

from torchrec_ascend.policies.base import EvictionPolicy


class Reference:
    """Base: residency and keys; subclasses define ``touch``, ``score`` and optionally ``expired``."""

    def __init__(self) -> None:
        self.key: Dict[int, int] = {}
        self.meta: Dict[int, dict] = {}

    def insert(self, slot: int, key: int, step: int, count: int, clicks: int) -> None:
        self.key[slot] = key
        self.meta[slot] = self.fresh(key, step)
        self.touch(slot, step, count, clicks)

    def remove(self, slot: int) -> None:
        del self.key[slot]
        self.meta.pop(slot)

    def fresh(self, key: int, step: int) -> dict:
        return {"inserted": step}

    def touch(self, slot: int, step: int, count: int, clicks: int) -> None:
        raise NotImplementedError

    def score(self, slot: int, step: int) -> tuple:
        raise NotImplementedError

    def expired(self, step: int) -> Optional[Set[int]]:
        return set()


class LRURef(Reference):
    def touch(self, slot, step, count, clicks):
        self.meta[slot]["last"] = step

    def score(self, slot, step):
        return (self.meta[slot]["last"],)


class LFURef(Reference):
    def __init__(self, history: bool = False) -> None:
        super().__init__()
        self.history = history
        self.remembered: Dict[int, int] = {}

    def fresh(self, key, step):
        return {"count": self.remembered.pop(key, 0) if self.history else 0}

    def remove(self, slot):
        if self.history:
            self.remembered[self.key[slot]] = self.meta[slot]["count"]
        super().remove(slot)

    def touch(self, slot, step, count, clicks):
        self.meta[slot]["count"] += count
        self.meta[slot]["last"] = step

    def score(self, slot, step):
        return (self.meta[slot]["count"], self.meta[slot]["last"])


class EpochLRURef(Reference):
    def __init__(self, epoch_steps: int) -> None:
        super().__init__()
        self.epoch_steps = epoch_steps

    def touch(self, slot, step, count, clicks):
        self.meta[slot]["epoch"] = step // self.epoch_steps

    def score(self, slot, step):
        return (self.meta[slot]["epoch"], self.meta[slot]["inserted"])


class EpochLFURef(Reference):
    def __init__(self, epoch_steps: int) -> None:
        super().__init__()
        self.epoch_steps = epoch_steps

    def fresh(self, key, step):
        return {"epoch": step // self.epoch_steps, "count": 0}

    def touch(self, slot, step, count, clicks):
        epoch = step // self.epoch_steps
        m = self.meta[slot]
        m["count"] = (m["count"] if m["epoch"] == epoch else 0) + count
        m["epoch"] = epoch

    def score(self, slot, step):
        return (self.meta[slot]["epoch"], self.meta[slot]["count"])


class TTLRef(LRURef):
    def __init__(self, ttl_steps: int) -> None:
        super().__init__()
        self.ttl_steps = ttl_steps

    def expired(self, step):
        return {s for s, m in self.meta.items() if step - m["last"] > self.ttl_steps}


class ShowClickRef(Reference):
    def __init__(self, alpha: float, beta: float, score_decay: float, evict_percentage: float) -> None:
        super().__init__()
        self.alpha, self.beta, self.decay, self.pct = alpha, beta, score_decay, evict_percentage

    def fresh(self, key, step):
        return {"score": 0.0, "last": step}

    def touch(self, slot, step, count, clicks):
        m = self.meta[slot]
        m["score"] = m["score"] * self.decay ** (step - m["last"]) + self.alpha * count + self.beta * clicks
        m["last"] = step

    def score(self, slot, step):
        m = self.meta[slot]
        return (m["score"] * self.decay ** (step - m["last"]),)

    def expired(self, step):
        return None  # a percentage of the lowest: checked as a ranking, not as a set


def _clicks(signals: Optional[Dict[str, torch.Tensor]], n: int) -> List[int]:
    return signals["clicks"].tolist() if signals and "clicks" in signals else [0] * n


class ReferenceTee(EvictionPolicy):
    """Forwards to ``policy``; checks every victim and expired answer against ``reference``."""

    def __init__(self, policy: EvictionPolicy, reference: Reference, tolerance: float = 0.0) -> None:
        super().__init__(policy.capacity)
        self.policy, self.ref, self.tolerance = policy, reference, tolerance

    def on_insert(self, slots, keys, step, counts=None, signals=None):
        self.policy.on_insert(slots, keys, step, counts=counts, signals=signals)
        counts_list = counts.tolist() if counts is not None else [1] * slots.numel()
        for s, k, c, cl in zip(slots.tolist(), keys.tolist(), counts_list, _clicks(signals, slots.numel())):
            self.ref.insert(s, k, step, c, cl)

    def on_access(self, slots, keys, counts, step, signals=None):
        self.policy.on_access(slots, keys, counts, step, signals=signals)
        for s, c, cl in zip(slots.tolist(), counts.tolist(), _clicks(signals, slots.numel())):
            self.ref.touch(s, step, c, cl)

    def on_remove(self, slots):
        self.policy.on_remove(slots)
        for s in slots.tolist():
            self.ref.remove(s)

    def _check_lowest(self, chosen: List[int], candidates: Set[int], step: int, what: str) -> None:
        rest = candidates - set(chosen)
        if not chosen or not rest:
            return
        worst = max(self.ref.score(s, step) for s in chosen)
        best_left = min(self.ref.score(s, step) for s in rest)
        ok = worst <= best_left or (
            self.tolerance and math.isclose(worst[0], best_left[0], rel_tol=self.tolerance, abs_tol=self.tolerance)
        )
        assert ok, f"step {step}: {what} {chosen} scored up to {worst}, but {best_left} was left among {sorted(rest)}"

    def select_victims(self, num, evictable, step):
        victims = self.policy.select_victims(num, evictable, step)
        candidates = {s for s in self.ref.key if bool(evictable[s])}
        self._check_lowest(victims.tolist(), candidates, step, "victims")
        return victims

    def expired(self, step):
        out = self.policy.expired(step)
        expected = self.ref.expired(step)
        if expected is None:
            self._check_lowest(out.tolist(), set(self.ref.key), step, "expired")
        else:
            assert set(out.tolist()) == expected, f"step {step}: expired {sorted(out.tolist())} != {sorted(expected)}"
        return out


def collision_free_size(keys: List[int], start: int = 64) -> int:
    """Smallest bounded-key-table size >= ``start`` in which ``keys`` all get distinct buckets (exact counting)."""
    from torchrec_ascend.policies.key_table import BoundedKeyScores

    pool = torch.tensor(keys, dtype=torch.int64)
    size = start
    while torch.unique(BoundedKeyScores(size).bucket(pool)).numel() != pool.numel():
        size += 1
    return size

"""Benchmark of per-batch eviction-policy overhead, as ratios against LRU measured in the same run.

Each installed eviction policy (created through the registry, so the checked wrapper's validation is included,
as the cache owner pays it) replays the same workload in the cache simulator: a cache of ``--capacity`` slots
(100k) and batches of exactly ``--unique`` distinct keys (16k) drawn from a Zipf(``--alpha``) catalogue of
``--keys`` IDs. Only the time spent inside the policy is counted per batch: ``on_access`` + ``select_victims`` +
``on_insert`` + ``on_remove`` (+ ``expired`` on cadence steps). Reported: the median over the batches after the
cache is full, in milliseconds, and the ratio to LRU's median. Admission policies are timed the same way on
``admit`` of one batch's keys, against ``count``.

Run briefly, pinned to one core::

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/bench_policies.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Dict, List, Optional

import torch

from torchrec_ascend.policies.base import EvictionPolicy
from torchrec_ascend.policies.hashing import mix64
from torchrec_ascend.policies.registry import create_admission_policy, create_eviction_policy, list_policies
from torchrec_ascend.policies.simulator import prepare, replay

# policies that need options to run at all
OPTIONS: Dict[str, Dict[str, Any]] = {"ttl": {"ttl_steps": 20}}


class TimedPolicy(EvictionPolicy):
    """Forwards every call to ``policy`` and adds its duration to the current step's total."""

    def __init__(self, policy: EvictionPolicy) -> None:
        super().__init__(policy.capacity)
        self.policy = policy
        self.per_step: Dict[int, float] = {}
        self.step = 0

    def _timed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        self.per_step[self.step] = self.per_step.get(self.step, 0.0) + time.perf_counter() - start
        return out

    def on_insert(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        step: int,
        counts: Optional[torch.Tensor] = None,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        self.step = step
        self._timed(self.policy.on_insert, slots, keys, step, counts=counts, signals=signals)

    def on_access(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        counts: torch.Tensor,
        step: int,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        self.step = step
        self._timed(self.policy.on_access, slots, keys, counts, step, signals=signals)

    def on_remove(self, slots: torch.Tensor) -> None:
        self._timed(self.policy.on_remove, slots)

    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        self.step = step
        return self._timed(self.policy.select_victims, num, evictable, step)

    def expired(self, step: int) -> torch.Tensor:
        self.step = step
        return self._timed(self.policy.expired, step)


def workload(num_batches: int, unique: int, num_keys: int, alpha: float, seed: int) -> torch.Tensor:
    """A trace of ``num_batches`` batches, each exactly ``unique`` distinct Zipf-popular keys (63-bit IDs)."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.arange(1, num_keys + 1, dtype=torch.float64).pow(-alpha)
    batches = [torch.multinomial(weights, unique, replacement=False, generator=generator) for _ in range(num_batches)]
    return mix64(torch.cat(batches), seed)


def median_ms(name: str, options: Dict[str, Any], batches: Any, capacity: int, warmup: int) -> Optional[float]:
    """Median per-batch milliseconds spent in policy ``name`` after ``warmup`` batches."""
    timed = TimedPolicy(create_eviction_policy(name, capacity, **options))
    replay(batches, timed)
    times = [t for step, t in sorted(timed.per_step.items()) if step >= warmup]
    return 1e3 * statistics.median(times) if times else None


def admission_ms(name: str, keys: torch.Tensor, repeats: int) -> float:
    """Median milliseconds of one ``admit`` call on ``keys``, over fresh batches of the same size."""
    policy = create_admission_policy(name)
    counts = torch.ones_like(keys)
    times = []
    for step in range(repeats):
        batch = mix64(keys, step)  # new keys every call, as admission only sees keys not in the table
        start = time.perf_counter()
        policy.admit(batch, counts, step)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv: Optional[List[str]] = None) -> None:
    """Parse the arguments, run both benchmarks, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--unique", type=int, default=16_384, help="distinct keys per batch")
    parser.add_argument("--keys", type=int, default=1_000_000, help="catalogue size")
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10, help="batches before timing (cache filling up)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    batches = prepare(workload(args.batches, args.unique, args.keys, args.alpha, args.seed), args.unique)
    print(f"eviction: cache {args.capacity} slots, {args.unique} distinct keys per batch, Zipf({args.alpha}) over "
          f"{args.keys} keys, median of {args.batches - args.warmup} batches after {args.warmup} warm-up")  # fmt: skip
    results = {
        e.name: median_ms(e.name, OPTIONS.get(e.name, {}), batches, args.capacity, args.warmup)
        for e in list_policies("eviction")
    }
    baseline = results["lru"]
    print(f"{'policy':<12}{'ms/batch':>10}{'vs lru':>9}")
    for name, ms in results.items():
        print(f"{name:<12}{ms:>10.3f}{ms / baseline:>9.2f}")

    keys = torch.arange(args.unique, dtype=torch.int64)
    admission = {e.name: admission_ms(e.name, keys, repeats=20) for e in list_policies("admission")}
    print(f"\nadmission: admit() of {args.unique} new keys, median of 20 calls")
    print(f"{'policy':<14}{'ms/batch':>10}{'vs count':>10}")
    for name, ms in admission.items():
        print(f"{name:<14}{ms:>10.3f}{ms / admission['count']:>10.2f}")


if __name__ == "__main__":
    main()

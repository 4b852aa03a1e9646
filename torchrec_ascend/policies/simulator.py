"""Cache simulator: replays an ID trace through eviction policies as the KEY_VALUE device cache would.

Batch semantics (the same for every policy and for the optimum):

* the trace is cut into consecutive batches of ``batch_size`` accesses; each batch is deduplicated;
* a *lookup* is one distinct key of one batch; it *hits* if the key is resident when the batch starts;
* after the batch every key of it is resident: misses are inserted into free slots, and when there are too few,
  victims are evicted among the resident slots the batch does not use (chosen by the policy, through an
  :class:`EvictionCadence`; on cadence steps the slots the policy calls expired are dropped first).

The optimum is Belady's MIN under the same semantics: it evicts the resident slots whose key is next used
furthest in the future. Next uses are computed for the whole trace at once (sort by key, then batch). A second
yardstick, ``oracle_lfu``, knows only each key's total popularity: on stationary traces it bounds what an online
policy can reach, which shows how much of the gap to Belady any policy could close.
Per-batch work is a few tensor ops over the batch and the capacity, never a loop over IDs.

Example::

    report = simulate(zipf_trace(1_000_000, 100_000), batch_size=4096, capacities=[5_000, 20_000],
                      policies={"lru": {}, "lfu": {}})
    print(report.table())
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.base import EvictionPolicy
from torchrec_ascend.policies.cadence import EvictionCadence
from torchrec_ascend.policies.options import positive_int
from torchrec_ascend.policies.registry import create_eviction_policy
from torchrec_ascend.policies.scored import ScoredEvictionPolicy

OPTIMAL = "belady"
REFERENCE_STYLES = {
    OPTIMAL: dict(color="black", linestyle="--", linewidth=2),
    "oracle_lfu": dict(color="gray", linestyle=":", linewidth=2),
}


@dataclasses.dataclass(frozen=True)
class TraceBatches:
    """A trace cut into deduplicated batches, with each lookup's next use.

    Lookup ``j`` (one distinct key of one batch) is stored batch-major, keys ascending within a batch; batch
    ``b`` owns lookups ``offsets[b]:offsets[b + 1]``.

    Attributes:
        keys: raw IDs, int64 ``[L]``.
        dense: the same IDs numbered ``0..num_keys-1`` (order-preserving), int64 ``[L]``.
        counts: occurrences in the batch, int64 ``[L]``.
        offsets: int64 ``[num_batches + 1]``.
        next_use: batch of the key's next lookup, ``num_batches`` if none, int64 ``[L]``.
        num_keys: distinct IDs in the trace.
        num_accesses: trace length.
    """

    keys: torch.Tensor
    dense: torch.Tensor
    counts: torch.Tensor
    offsets: torch.Tensor
    next_use: torch.Tensor
    num_keys: int
    num_accesses: int

    @property
    def num_batches(self) -> int:
        """Number of batches."""
        return self.offsets.numel() - 1

    @property
    def max_batch_keys(self) -> int:
        """Distinct keys of the largest batch: the smallest cache that can run the trace."""
        return int((self.offsets[1:] - self.offsets[:-1]).max()) if self.num_batches else 0


def prepare(trace: torch.Tensor, batch_size: int) -> TraceBatches:
    """Cut ``trace`` into deduplicated batches and compute every lookup's next use.

    Args:
        trace (torch.Tensor): int64 ``[N]`` raw IDs in access order.
        batch_size (int): accesses per batch (the last batch may be shorter).

    Returns:
        TraceBatches: see its attributes.

    Raises:
        ConfigError: ``trace`` is not a 1-D int64 tensor or ``batch_size`` is not a positive integer.

    Example::

        batches = prepare(torch.tensor([5, 5, 7, 5]), batch_size=2)  # lookups (5), (7, 5)
    """
    if not isinstance(trace, torch.Tensor) or trace.dtype != torch.int64 or trace.dim() != 1:
        raise ConfigError("the simulator replays a 1-D int64 tensor of IDs; convert the trace with .long()")
    batch_size = positive_int("simulator", "batch_size", batch_size)
    ids, dense_all = torch.unique(trace, return_inverse=True)
    num_keys = ids.numel()
    num_batches = -(-trace.numel() // batch_size)
    batch_of = torch.arange(trace.numel(), dtype=torch.int64) // batch_size
    pairs, counts = torch.unique(batch_of * num_keys + dense_all, return_counts=True)
    batch, dense = pairs // max(num_keys, 1), pairs % max(num_keys, 1)
    offsets = torch.searchsorted(batch, torch.arange(num_batches + 1, dtype=torch.int64))
    # next use: order lookups by (key, batch); the following lookup of the same key is the next use
    order = torch.argsort(dense * num_batches + batch)
    key_sorted, batch_sorted = dense[order], batch[order]
    following = torch.full_like(batch_sorted, num_batches)
    same = key_sorted[1:] == key_sorted[:-1]
    following[:-1] = torch.where(same, batch_sorted[1:], num_batches)
    next_use = torch.empty_like(following)
    next_use[order] = following
    return TraceBatches(ids[dense], dense, counts, offsets, next_use, num_keys, trace.numel())


class TraceOraclePolicy(ScoredEvictionPolicy):
    """A reference that knows the trace: evicts the slots whose key's latest lookup has the lowest ``value``.

    It reads ``batches``, so it only works inside :func:`replay` of the same trace (``step`` is the batch index);
    it is a yardstick for the simulator, not an installable policy. See :func:`belady_policy` and
    :func:`frequency_oracle_policy`.

    Args:
        capacity (int): number of slots.
        batches (TraceBatches): the trace being replayed.
        value (torch.Tensor): one number per lookup of ``batches``, int64 or float ``[L]``.

    Example::

        replay(batches, TraceOraclePolicy(1024, batches, -batches.next_use))  # Belady
    """

    state_names = ("value",)

    def __init__(self, capacity: int, batches: TraceBatches, value: torch.Tensor) -> None:
        super().__init__(capacity)
        self.batches = batches
        self.lookup_value = value
        self.value = torch.zeros(capacity, dtype=value.dtype)

    def _take(self, slots: torch.Tensor, keys: torch.Tensor, step: int) -> None:
        """``slots`` take the value of their keys' lookups in batch ``step``."""
        start, end = int(self.batches.offsets[step]), int(self.batches.offsets[step + 1])
        position = start + torch.searchsorted(self.batches.keys[start:end], keys)  # keys ascend within a batch
        self.value[slots] = self.lookup_value[position]

    def reset(self, slots: torch.Tensor, keys: torch.Tensor, step: int) -> None:
        self._take(slots, keys, step)

    def record(
        self, slots: torch.Tensor, counts: torch.Tensor, step: int, signals: Optional[Dict[str, torch.Tensor]]
    ) -> None:
        pass  # the value comes with the keys: reset (an insert) and on_access take it

    def on_access(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        counts: torch.Tensor,
        step: int,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        self._take(slots, keys, step)

    def scores(self, step: int) -> torch.Tensor:
        return self.value


def belady_policy(capacity: int, batches: TraceBatches) -> TraceOraclePolicy:
    """Belady's MIN: evicts the slots whose key is next used furthest in the future (the optimum).

    Example::

        best = replay(batches, belady_policy(1024, batches)).hit_rate
    """
    return TraceOraclePolicy(capacity, batches, -batches.next_use)


def frequency_oracle_policy(capacity: int, batches: TraceBatches) -> TraceOraclePolicy:
    """Perfect LFU: evicts the slots whose key has the fewest lookups in the whole trace.

    It knows how popular each key is, not when it is used: on a stationary trace (independent draws, like
    ``zipf``) this is the classic bound for what an online policy can reach, well below Belady's at small caches.

    Example::

        bound = replay(batches, frequency_oracle_policy(1024, batches)).hit_rate
    """
    totals = torch.zeros(batches.num_keys, dtype=torch.int64).index_add_(
        0, batches.dense, torch.ones_like(batches.dense)
    )
    return TraceOraclePolicy(capacity, batches, totals[batches.dense])


#: Reference policies every simulation runs, by the name reports give them.
REFERENCES = {OPTIMAL: belady_policy, "oracle_lfu": frequency_oracle_policy}


@dataclasses.dataclass(frozen=True)
class SimResult:
    """Outcome of replaying one trace through one policy at one cache size.

    Attributes:
        policy (str): policy name (``"belady"`` for the optimum).
        capacity (int): cache slots.
        hits (int): lookups found resident.
        lookups (int): distinct keys summed over batches.
        seconds (float): wall time of the replay.
    """

    policy: str
    capacity: int
    hits: int
    lookups: int
    seconds: float

    @property
    def hit_rate(self) -> float:
        """``hits / lookups`` (0 for an empty trace)."""
        return self.hits / self.lookups if self.lookups else 0.0


def replay(batches: TraceBatches, policy: EvictionPolicy, cadence: Optional[EvictionCadence] = None) -> SimResult:
    """Replay prepared batches through ``policy`` (module docstring semantics) and count hits.

    Args:
        batches (TraceBatches): from :func:`prepare`.
        policy (EvictionPolicy): a fresh policy; its ``capacity`` is the cache size.
        cadence (EvictionCadence, optional): eviction cadence; default evicts exactly what each batch needs.

    Returns:
        SimResult: with ``policy`` set to the policy's class name (``simulate`` names it).

    Raises:
        ConfigError: the cache is smaller than the largest batch's distinct keys.

    Example::

        result = replay(prepare(trace, 1024), create_eviction_policy("lru", capacity=4096))
    """
    capacity = policy.capacity
    if batches.max_batch_keys > capacity:
        raise ConfigError(
            f"cache size {capacity} is smaller than the {batches.max_batch_keys} distinct keys of the largest "
            f"batch; every key of a batch must be resident at once: use a larger cache or smaller batches"
        )
    cadence = cadence or EvictionCadence(capacity)
    slot_of = torch.full((batches.num_keys,), -1, dtype=torch.int64)
    dense_of = torch.full((capacity,), -1, dtype=torch.int64)  # key held by each slot, -1 when free
    offsets = batches.offsets.tolist()
    hits = 0
    start_time = time.perf_counter()

    def remove(slots: torch.Tensor) -> None:
        slot_of[dense_of[slots]] = -1
        dense_of[slots] = -1
        policy.on_remove(slots)
        cadence.on_remove(slots)

    for step in range(batches.num_batches):
        lo, hi = offsets[step], offsets[step + 1]
        dense, keys, counts = batches.dense[lo:hi], batches.keys[lo:hi], batches.counts[lo:hi]
        if cadence.due(step):
            expired = policy.expired(step)
            if expired.numel():
                remove(expired)
        slots = slot_of[dense]
        hit = slots >= 0
        hit_slots = slots[hit]
        hits += hit_slots.numel()
        if hit_slots.numel():
            policy.on_access(hit_slots, keys[hit], counts[hit], step)
        miss = ~hit
        num_missing = dense.numel() - hit_slots.numel()
        free = dense_of < 0
        num_free = int(free.sum())
        num_evict = cadence.num_to_evict(num_free, num_missing, capacity - num_free - hit_slots.numel(), step)
        if num_evict:
            evictable = torch.ones(capacity, dtype=torch.bool)
            evictable[hit_slots] = False
            remove(cadence.select(policy, num_evict, evictable, step))
            free = dense_of < 0
        if num_missing:
            new_slots = free.nonzero().squeeze(1)[:num_missing]
            slot_of[dense[miss]] = new_slots
            dense_of[new_slots] = dense[miss]
            policy.on_insert(new_slots, keys[miss], step, counts=counts[miss])
            cadence.on_insert(new_slots, step)
    seconds = time.perf_counter() - start_time
    return SimResult(type(policy).__name__, capacity, hits, int(batches.offsets[-1]), seconds)


@dataclasses.dataclass
class SimReport:
    """Hit rates of several policies and of the optimum at several cache sizes, for one trace.

    Attributes:
        trace (str): trace label.
        batch_size (int): accesses per batch.
        num_accesses (int): trace length.
        num_keys (int): distinct IDs.
        results (List[SimResult]): one per (policy, capacity), references (:data:`REFERENCES`) included.
        notes (List[str]): what was left out and why (policies whose options were rejected...).
    """

    trace: str
    batch_size: int
    num_accesses: int
    num_keys: int
    results: List[SimResult]
    notes: List[str] = dataclasses.field(default_factory=list)

    def policies(self) -> List[str]:
        """Policy names in result order, the references first."""
        return list(dict.fromkeys(r.policy for r in self.results))

    def capacities(self) -> List[int]:
        """Cache sizes, ascending."""
        return sorted({r.capacity for r in self.results})

    def result(self, policy: str, capacity: int) -> SimResult:
        """The result of ``policy`` at ``capacity``.

        Raises:
            ConfigError: ``policy`` was not simulated at ``capacity``.
        """
        for r in self.results:
            if r.policy == policy and r.capacity == capacity:
                return r
        raise ConfigError(
            f"simulator report: policy {policy!r} was not simulated at capacity {capacity}; it holds policies "
            f"{self.policies()} at capacities {self.capacities()}"
        )

    def ratio(self, policy: str, capacity: int) -> float:
        """Hit rate of ``policy`` divided by the optimum's at ``capacity`` (1.0 = optimal)."""
        best = self.result(OPTIMAL, capacity).hit_rate
        return self.result(policy, capacity).hit_rate / best if best else 1.0

    def table(self) -> str:
        """A plain-text table: hit rate and ratio to the optimum per policy and cache size."""
        caps = self.capacities()
        header = f"{'policy':<16}" + "".join(f"{'cache ' + str(c):>22}" for c in caps)
        lines = [
            f"trace {self.trace}: {self.num_accesses} accesses, {self.num_keys} distinct keys, "
            f"batches of {self.batch_size}; hit rate (ratio to Belady's optimum)",
            header,
            "-" * len(header),
        ]
        for policy in self.policies():
            cells = "".join(f"{self.result(policy, c).hit_rate:>13.4f} ({self.ratio(policy, c):5.3f})" for c in caps)
            lines.append(f"{policy:<16}{cells}")
        lines += self.notes
        return "\n".join(lines)


def simulate(
    trace: torch.Tensor,
    batch_size: int,
    capacities: Sequence[int],
    policies: Mapping[str, Dict[str, Any]],
    label: str = "trace",
    cadence_options: Optional[Dict[str, Any]] = None,
) -> SimReport:
    """Replay ``trace`` through each policy and the references (Belady's optimum, oracle LFU) at each cache size.

    Args:
        trace (torch.Tensor): int64 ``[N]`` IDs.
        batch_size (int): accesses per batch.
        capacities (Sequence[int]): cache sizes in slots.
        policies (Mapping[str, dict]): eviction policy name (composites allowed) -> its options.
        label (str): trace name for the report.
        cadence_options (dict, optional): :class:`EvictionCadence` options (interval, min_residency, headroom).

    Returns:
        SimReport: results, plus notes on the policies skipped because their options were rejected.

    Raises:
        ConfigError: a cache size below the largest batch's distinct keys, or a bad trace.

    Example::

        simulate(trace, 4096, [10_000], {"lru": {}, "ttl+lfu": {"ttl": {"ttl_steps": 50}}}).table()
    """
    batches = prepare(trace, batch_size)
    results: List[SimResult] = []
    skipped: Dict[str, str] = {}
    cadence_options = cadence_options or {}
    for capacity in capacities:
        for reference, make in REFERENCES.items():
            result = replay(batches, make(capacity, batches), EvictionCadence(capacity, **cadence_options))
            results.append(dataclasses.replace(result, policy=reference))
        for name, options in policies.items():
            if name in skipped:
                continue
            try:
                policy = create_eviction_policy(name, capacity, **options)
            except ConfigError as err:
                skipped[name] = str(err)
                continue
            result = replay(batches, policy, EvictionCadence(capacity, **cadence_options))
            results.append(dataclasses.replace(result, policy=name))
    notes = [f"skipped {name}: {why}" for name, why in skipped.items()]
    return SimReport(label, batch_size, batches.num_accesses, batches.num_keys, results, notes)


def plot(reports: Sequence[SimReport], path: str) -> None:
    """Write a PNG with one panel per report: hit rate against cache size, the references dashed and dotted.

    Args:
        reports (Sequence[SimReport]): one per trace.
        path (str): output file.

    Raises:
        ConfigError: matplotlib is not installed.

    Example::

        plot([report], "cache_sim.png")
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ConfigError(
            f"plotting to {path} needs matplotlib: `pip install matplotlib`, or skip the plot (cache-sim --plot '')"
        ) from err

    fig, axes = plt.subplots(1, len(reports), figsize=(5.5 * len(reports), 4.2), squeeze=False)
    for ax, report in zip(axes[0], reports):
        caps = report.capacities()
        for policy in report.policies():
            rates = [report.result(policy, c).hit_rate for c in caps]
            style = REFERENCE_STYLES.get(policy, dict(marker="o"))
            ax.plot(caps, rates, label=policy, **style)
        ax.set_xscale("log")
        ax.set_xlabel("cache slots")
        ax.set_ylabel("hit rate (distinct keys per batch)")
        ax.set_title(f"{report.trace} ({report.num_accesses} accesses, batch {report.batch_size})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

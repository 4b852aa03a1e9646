"""Contract kit: hypothesis property checks that every eviction and admission policy must pass.

``check_policy("lfu")`` drives fresh instances of the policy the way a cache owner does, over generated
sequences of batches, with a dict/set model of residency as the oracle, and reports per check whether it held
and, if not, the (shrunk) falsifying example. ``torchrec-ascend conformance --policy NAME`` prints the report.

Eviction checks: victims and expired slots are well formed against the model (exactly ``num``, distinct,
resident, evictable, in range) and the cache never exceeds its capacity, under general workloads and under
empty batches, huge IDs (up to ``2**63 - 1``) and keys repeated across batches; two fresh instances fed the
same calls decide the same; a ``state_dict``/``load_state_dict`` round trip gives identical future decisions.

Admission checks: ``admit`` returns a bool mask of the keys' shape (so it never admits a key it was not given),
under the same workloads; determinism; the state round trip.

Example::

    report = check_policy("ttl+lfu", options={"ttl": {"ttl_steps": 3}})
    print(report)
    assert report.passed
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

try:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
except ImportError as err:  # a test dependency: the rest of the package works without it
    raise ImportError(
        "the policy contract kit runs hypothesis property checks; install it with "
        "`pip install 'torchrec-ascend[test]'` (or `pip install hypothesis`)"
    ) from err

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.base import AdmissionPolicy, EvictionPolicy
from torchrec_ascend.policies.registry import COMPOSE, create_eviction_policy, find_policy, list_policies
from torchrec_ascend.policies.validation import admission_problem, slots_problem, state_problem, victims_problem

HUGE = 2**63 - 1
#: Every check, in the order reports list them (each run once per policy kind).
CHECKS = (
    "general workload",
    "empty batches",
    "huge IDs",
    "keys repeated across batches",
    "deterministic",
    "state_dict round trip",
)


class ContractViolation(AssertionError):
    """A policy broke the contract; the message says how and on which example."""


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """Outcome of one property check.

    Attributes:
        name (str): the check (``"eviction: deterministic"``...).
        passed (bool): whether every generated example held.
        message (str): what went wrong (empty when passed).
        example (str): the shrunk falsifying example (empty when passed).
    """

    name: str
    passed: bool
    message: str = ""
    example: str = ""


@dataclasses.dataclass(frozen=True)
class ContractReport:
    """All checks run for one policy name.

    Attributes:
        policy (str): the policy name (composites allowed).
        results (List[CheckResult]): one per check.
    """

    policy: str
    results: List[CheckResult]

    @property
    def passed(self) -> bool:
        """True when every check passed."""
        return all(r.passed for r in self.results)

    def failures(self) -> List[CheckResult]:
        """The checks that failed."""
        return [r for r in self.results if not r.passed]

    def __str__(self) -> str:
        lines = [f"policy {self.policy!r}: {'PASS' if self.passed else 'FAIL'}"]
        for r in self.results:
            lines.append(f"  [{'pass' if r.passed else 'FAIL'}] {r.name}")
            if not r.passed:
                lines.append(f"         {r.message}")
                lines.append(f"         falsifying example: {r.example}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Step:
    """One owner step of a generated workload.

    Attributes:
        keys: the batch's raw IDs (duplicates allowed; the owner deduplicates and counts).
        pin: the oldest resident keys (up to ``pin``) are in use by an in-flight batch, when capacity allows.
        extra: slots to evict on top of what the batch needs (bulk eviction), bounded by what is evictable.
        expire: ask for expired slots and drop them before the batch.
        drop: the owner removes its oldest resident key itself (not the policy's choice).
    """

    keys: List[int]
    pin: int = 0
    extra: int = 0
    expire: bool = False
    drop: bool = False

    def __repr__(self) -> str:
        flags = [f for f in ("expire", "drop") if getattr(self, f)]
        flags += [f"{f}={getattr(self, f)}" for f in ("pin", "extra") if getattr(self, f)]
        return f"Step({self.keys}{', ' if flags else ''}{', '.join(flags)})"


def _signals(counts: torch.Tensor) -> Dict[str, torch.Tensor]:
    # deterministic per-key engagement signals, so show/click policies are exercised too
    return {"shows": counts, "clicks": counts % 2}


def _dedup(keys: List[int], limit: int) -> tuple:
    unique, counts = torch.unique(torch.tensor(keys, dtype=torch.int64), return_counts=True)
    return unique[:limit], counts[:limit]


class _Driver(abc.ABC):
    """What both drivers share: a policy, the step, and policy calls whose exceptions are contract violations."""

    policy: Any
    step: int
    outputs: List[List[Any]]

    @abc.abstractmethod
    def play(self, step: Step) -> None:
        """Play one step against the policy, checking its answers."""

    def run(self, steps: Sequence[Step]) -> List[List[Any]]:
        """Play ``steps`` in order; return every answer the policy gave, in order."""
        for step in steps:
            self.play(step)
        return self.outputs

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.policy, method)(*args, **kwargs)
        except Exception as err:
            raise ContractViolation(f"step {self.step}: {method} raised {type(err).__name__}: {err}") from err


class EvictionDriver(_Driver):
    """Plays a cache owner around an eviction policy, checking every answer against a dict model.

    Args:
        policy (EvictionPolicy): a fresh policy.

    Example::

        outputs = EvictionDriver(policy).run([Step([1, 2]), Step([3], expire=True)])
    """

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.capacity = policy.capacity
        self.slot_of: Dict[int, int] = {}  # the model: resident key -> slot
        self.inserted: List[int] = []  # resident keys, oldest insert first
        self.step = 0
        self.outputs: List[List[int]] = []

    def _resident_mask(self) -> torch.Tensor:
        mask = torch.zeros(self.capacity, dtype=torch.bool)
        mask[list(self.slot_of.values())] = True
        return mask

    def _fail(self, what: str) -> None:
        raise ContractViolation(f"step {self.step}: {what}")

    def _remove(self, slots: List[int]) -> None:
        by_slot = {s: k for k, s in self.slot_of.items()}
        for s in slots:
            key = by_slot[s]
            del self.slot_of[key]
            self.inserted.remove(key)
        self._call("on_remove", torch.tensor(slots, dtype=torch.int64))

    def _expire(self) -> None:
        expired = self._call("expired", self.step)
        problem = slots_problem(expired, self.capacity, self._resident_mask())
        if problem:
            self._fail(f"expired(step={self.step}) {problem}")
        self.outputs.append(["expired"] + sorted(expired.tolist()))
        if expired.numel():
            self._remove(expired.tolist())

    def _evict(self, num: int, in_use: set) -> None:
        evictable = torch.ones(self.capacity, dtype=torch.bool)
        evictable[[self.slot_of[k] for k in in_use if k in self.slot_of]] = False
        resident = self._resident_mask()
        victims = self._call("select_victims", num, evictable.clone(), self.step)
        problem = victims_problem(victims, num, self.capacity, resident, evictable)
        if problem:
            self._fail(f"select_victims(num={num}) {problem}")
        self.outputs.append(["victims"] + victims.tolist())
        if victims.numel():
            self._remove(victims.tolist())

    def play(self, step: Step) -> None:
        """Run one step: optional expiry and drop, lookups, evictions, inserts; check every answer."""
        if step.expire:
            self._expire()
        if step.drop and self.inserted:
            key = self.inserted[0]
            self._remove([self.slot_of[key]])
        keys, counts = _dedup(step.keys, self.capacity)
        key_list = keys.tolist()
        hit = torch.tensor([k in self.slot_of for k in key_list], dtype=torch.bool)
        if bool(hit.any()):
            slots = torch.tensor([self.slot_of[k] for k in key_list if k in self.slot_of], dtype=torch.int64)
            self._call("on_access", slots, keys[hit], counts[hit], self.step, signals=_signals(counts[hit]))
        in_use = set(key_list)
        pinned = in_use | set(self.inserted[: step.pin])
        if len(pinned) <= self.capacity:
            in_use = pinned  # an in-flight batch fits next to this one
        missing = [k for k in key_list if k not in self.slot_of]
        free = self.capacity - len(self.slot_of)
        evictable_count = len(self.slot_of) - len([k for k in in_use if k in self.slot_of])
        num = max(0, len(missing) - free) + min(step.extra, max(0, evictable_count - max(0, len(missing) - free)))
        self._evict(num, in_use)
        used = set(self.slot_of.values())
        free_slots = [s for s in range(self.capacity) if s not in used][: len(missing)]
        for key, slot in zip(missing, free_slots):
            self.slot_of[key] = slot
            self.inserted.append(key)
        if missing:
            miss = ~hit
            self._call(
                "on_insert", torch.tensor(free_slots, dtype=torch.int64), keys[miss], self.step,
                counts=counts[miss], signals=_signals(counts[miss]),
            )  # fmt: skip
        if len(self.slot_of) > self.capacity:
            self._fail(f"{len(self.slot_of)} resident keys exceed the capacity {self.capacity}")
        self.step += 1


class AdmissionDriver(_Driver):
    """Plays a table owner around an admission policy: offers keys not in the table, admits, forgets some.

    Args:
        policy (AdmissionPolicy): a fresh policy.
    """

    def __init__(self, policy: AdmissionPolicy) -> None:
        self.policy = policy
        self.table: set = set()
        self.step = 0
        self.outputs: List[List[Any]] = []

    def play(self, step: Step) -> None:
        """Offer the batch's keys that are not in the table; ``drop`` evicts the smallest table key first."""
        if step.drop and self.table:
            gone = min(self.table)
            self.table.discard(gone)
            self._call("forget", torch.tensor([gone], dtype=torch.int64))
        keys, counts = _dedup([k for k in step.keys if k not in self.table], len(step.keys))
        mask = self._call("admit", keys, counts, self.step, _signals(counts))
        problem = admission_problem(mask, keys)
        if problem:
            raise ContractViolation(f"step {self.step}: admit({len(keys)} keys) {problem}")
        self.table.update(keys[mask].tolist())
        self.outputs.append(mask.tolist())
        self.step += 1


def steps_strategy(keys: st.SearchStrategy, capacity: int, max_steps: int) -> st.SearchStrategy:
    """Hypothesis strategy of owner workloads: lists of :class:`Step` whose keys come from ``keys``.

    Example::

        @given(steps_strategy(st.integers(0, 20), capacity=6, max_steps=10))
        def test_my_policy(steps):
            EvictionDriver(MyPolicy(6)).run(steps)
    """
    step = st.builds(
        Step,
        keys=st.lists(keys, max_size=capacity + 2),
        pin=st.integers(0, capacity),
        extra=st.integers(0, 2),
        expire=st.booleans(),
        drop=st.booleans(),
    )
    return st.lists(step, min_size=1, max_size=max_steps)


def _workloads(capacity: int, max_steps: int) -> Dict[str, st.SearchStrategy]:
    mixed = st.one_of(st.integers(0, 3 * capacity), st.integers(HUGE - 3, HUGE))
    return {
        "general workload": steps_strategy(mixed, capacity, max_steps),
        "empty batches": steps_strategy(st.integers(0, 2 * capacity), 1, max_steps).map(
            lambda steps: [dataclasses.replace(s, keys=s.keys if i % 2 else []) for i, s in enumerate(steps)]
        ),
        "huge IDs": steps_strategy(st.integers(HUGE - 2 * capacity, HUGE), capacity, max_steps),
        "keys repeated across batches": steps_strategy(st.integers(0, capacity), capacity, max_steps).map(
            lambda steps: [s for s in steps for _ in range(2)]
        ),
    }


def _run_property(name: str, strategy: st.SearchStrategy, prop: Callable[[Any], None], cfg: settings) -> CheckResult:
    failure: Dict[str, str] = {}

    @cfg
    @given(strategy)
    def check(example: Any) -> None:
        try:
            prop(example)
        except Exception as err:
            # the last call that raises is hypothesis's final replay of the shrunk example
            failure["example"] = repr(example)
            failure["message"] = f"{type(err).__name__}: {err}"
            raise

    try:
        check()
    except Exception as err:  # hypothesis re-raises the (shrunk) failure, or reports flakiness
        message = failure.get("message") or f"{type(err).__name__}: {err}"
        return CheckResult(name, False, message, failure.get("example", ""))
    return CheckResult(name, True)


def _kinds(name: str, kind: Optional[str]) -> List[str]:
    if kind is not None:
        return [kind]
    if COMPOSE in name:
        return ["eviction"]
    present = [k for k in ("eviction", "admission") if any(e.name == name.strip().lower() for e in list_policies(k))]
    return present or ["eviction"]  # unknown names: let the eviction lookup raise its ConfigError


def check_policy(
    name: str,
    options: Optional[Dict[str, Any]] = None,
    examples: int = 30,
    kind: Optional[str] = None,
    capacity: int = 6,
    max_steps: int = 12,
    derandomize: bool = True,
    checks: Optional[Sequence[str]] = None,
) -> ContractReport:
    """Run the contract checks on the installed policy ``name`` (both kinds when a name is used by both).

    Args:
        name (str): policy name; an eviction composite such as ``"ttl+lfu"`` is allowed.
        options (dict, optional): the policy's options, as a table config would pass them.
        examples (int): generated examples per check (hypothesis ``max_examples``).
        kind (str, optional): ``"eviction"`` or ``"admission"``; default: every kind ``name`` exists as.
        capacity (int): slots of the simulated cache (small caches hit the corner cases).
        max_steps (int): most batches per generated workload.
        derandomize (bool): derive examples from the check itself, so a report is reproducible.
        checks (Sequence[str], optional): run only these of :data:`CHECKS` (default: all).

    Returns:
        ContractReport: per-check pass/fail with the falsifying example.

    Raises:
        ConfigError: unknown policy name, options or check (before any check runs).

    Example::

        report = check_policy("lru", examples=20)
        assert report.passed, str(report)
    """
    options = dict(options or {})
    selected = list(CHECKS) if checks is None else list(checks)
    unknown = sorted(set(selected) - set(CHECKS))
    if unknown:
        raise ConfigError(f"unknown contract check(s) {unknown}; the checks are: {', '.join(CHECKS)}")
    cfg = settings(
        max_examples=examples,
        deadline=None,
        derandomize=derandomize,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],  # no "explain": it doubles the time
    )
    results: List[CheckResult] = []
    for k in _kinds(name, kind):
        if k == "eviction":
            create_eviction_policy(name, capacity, **options)  # unknown names and options fail loudly, here
            factory: Callable[[], Any] = _eviction_factory(name, capacity, options)
            driver: Callable[[Any], Any] = EvictionDriver
        else:
            factory = _admission_factory(name, options)
            driver = AdmissionDriver
        results += _checks(k, factory, driver, capacity, max_steps, cfg, selected)
    return ContractReport(name, results)


def _admission_factory(name: str, options: Dict[str, Any]) -> Callable[[], AdmissionPolicy]:
    entry = find_policy(name, "admission")
    entry.build(**options)  # unknown options fail loudly, here
    return lambda: entry.build(**options)


def _eviction_factory(name: str, capacity: int, options: Dict[str, Any]) -> Callable[[], EvictionPolicy]:
    if COMPOSE in name:  # composites exist only through the registry (components checked, composite raw)
        return lambda: create_eviction_policy(name, capacity, **options)
    entry = find_policy(name, "eviction")
    return lambda: entry.build(capacity, **options)  # the raw policy: the kit reports, not the wrapper


def _checks(
    kind: str,
    factory: Callable[[], Any],
    driver: Callable[[Any], Any],
    capacity: int,
    max_steps: int,
    cfg: settings,
    selected: Sequence[str],
) -> List[CheckResult]:
    workloads = _workloads(capacity, max_steps)

    def well_formed(steps: List[Step]) -> None:
        driver(factory()).run(steps)

    def deterministic(steps: List[Step]) -> None:
        first, second = driver(factory()).run(steps), driver(factory()).run(steps)
        if first != second:
            at = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
            raise ContractViolation(
                f"two fresh instances given the same calls answered differently at answer {at}: "
                f"{first[at]} vs {second[at]}"
            )

    def round_trip(example: tuple) -> None:
        steps, cut = example
        cut = min(cut, len(steps))
        original = driver(factory())
        original.run(steps[:cut])
        state = original.policy.state_dict()
        problem = state_problem(state)
        if problem:
            raise ContractViolation(f"state_dict {problem}")
        restored = driver(factory())
        restored.policy.load_state_dict({k: v.clone() for k, v in state.items()})
        _copy_owner(original, restored)
        original.outputs = []
        a, b = original.run(steps[cut:]), restored.run(steps[cut:])
        if a != b:
            at = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            raise ContractViolation(
                f"after load_state_dict at step {cut}, answer {at} differs from the original instance: "
                f"{a[at]} vs {b[at]}; state_dict must hold everything future decisions depend on"
            )

    general = workloads["general workload"]
    properties: Dict[str, Tuple[Any, Callable[[Any], None]]] = {
        label: (strategy, well_formed) for label, strategy in workloads.items()
    }
    properties["deterministic"] = (general, deterministic)
    properties["state_dict round trip"] = (st.tuples(general, st.integers(0, max_steps)), round_trip)
    return [
        _run_property(f"{kind}: {label}", strategy, prop, cfg)
        for label, (strategy, prop) in properties.items()
        if label in selected
    ]


def _copy_owner(source: Any, target: Any) -> None:
    """Give ``target`` the owner-side model of ``source`` (what a checkpoint of the cache itself restores)."""
    for attr, value in vars(source).items():
        if attr not in ("policy", "outputs"):
            setattr(target, attr, value.copy() if hasattr(value, "copy") else value)

"""The example policy plugin: registered in-process (nothing installed) and checked against a dict reference."""

import math
from pathlib import Path

import pytest
import tomllib
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import decayed_lfu_policy
from torchrec_ascend import hookspecs
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.plugin_manager import PluginManager, get_plugin_manager
from torchrec_ascend.policies.contract import check_policy
from torchrec_ascend.policies.registry import create_eviction_policy

PROJECT_FILE = Path(decayed_lfu_policy.__file__).with_name("pyproject.toml")


def test_packaging_declares_the_entry_point():
    project = tomllib.loads(PROJECT_FILE.read_text())
    entry_points = project["project"]["entry-points"][hookspecs.PROJECT]
    assert entry_points == {"decayed_lfu": decayed_lfu_policy.__name__}
    assert project["tool"]["setuptools"]["py-modules"] == [decayed_lfu_policy.__name__]


def make_policy(capacity, half_life):
    manager = PluginManager()
    manager.register(decayed_lfu_policy, "decayed_lfu")
    [(spec, info)] = manager.collect("torchrec_ascend_policies")
    assert (spec.name, spec.kind, info.name) == ("decayed_lfu", "eviction", "decayed_lfu")
    return spec.factory(capacity=capacity, half_life=half_life)


class Reference:
    """Decayed counts, one slot at a time."""

    def __init__(self, half_life):
        self.half_life, self.slots = half_life, {}  # slot -> (score, stamp)

    def score(self, slot, step):
        score, stamp = self.slots[slot]
        return score * 2 ** ((stamp - step) / self.half_life)

    def insert(self, slots, counts, step):
        self.slots.update({s: (float(c), step) for s, c in zip(slots, counts)})

    def access(self, slots, counts, step):
        self.slots.update({s: (self.score(s, step) + c, step) for s, c in zip(slots, counts)})


CAPACITY = 8
operation = st.tuples(st.sampled_from(["insert", "access", "remove", "victims"]), st.integers(1, 3),
                      st.lists(st.integers(1, 5), min_size=CAPACITY, max_size=CAPACITY),
                      st.lists(st.booleans(), min_size=CAPACITY, max_size=CAPACITY))


@settings(deadline=None, max_examples=60)
@given(half_life=st.sampled_from([0.5, 3.0, 50.0]), operations=st.lists(operation, max_size=30))
def test_matches_reference(half_life, operations):
    policy, reference = make_policy(CAPACITY, half_life), Reference(half_life)
    for step, (kind, num, counts, flags) in enumerate(operations):
        resident = sorted(reference.slots)
        free = [s for s in range(CAPACITY) if s not in reference.slots]
        if kind == "insert" and free:
            slots = free[:num]
            given = counts[: len(slots)] if flags[0] else None  # counts, or the default of one access each
            policy.on_insert(torch.tensor(slots), torch.tensor(slots) + 100, step, given and torch.tensor(given))
            reference.insert(slots, given or [1] * len(slots), step)
        elif kind == "access" and resident:
            slots = [s for s, flag in zip(resident, flags) if flag] or resident[:1]
            policy.on_access(torch.tensor(slots), torch.tensor(slots) + 100, torch.tensor(counts[: len(slots)]), step)
            reference.access(slots, counts[: len(slots)], step)
        elif kind == "remove" and resident:
            policy.on_remove(torch.tensor(resident[:num]))
            for slot in resident[:num]:
                del reference.slots[slot]
        elif kind == "victims":
            evictable = torch.tensor(flags)
            eligible = [s for s in resident if flags[s]]
            if len(eligible) < num:
                continue  # the owner never asks for more victims than evictable residents
            victims = policy.select_victims(num, evictable, step).tolist()
            assert len(set(victims)) == num and set(victims) <= set(eligible)
            lowest = sorted(reference.score(s, step) for s in eligible)[:num]
            got = sorted(reference.score(s, step) for s in victims)
            assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(got, lowest))


def test_state_dict_round_trip():
    policy = make_policy(4, 2.0)
    policy.on_insert(torch.tensor([0, 1, 2]), torch.tensor([5, 6, 7]), step=0)
    policy.on_access(torch.tensor([0, 2]), torch.tensor([5, 7]), torch.tensor([4, 1]), step=3)
    restored = make_policy(4, 2.0)
    restored.load_state_dict(policy.state_dict())
    evictable = torch.ones(4, dtype=torch.bool)
    assert restored.select_victims(2, evictable, 9).tolist() == policy.select_victims(2, evictable, 9).tolist()


def test_bad_half_life_is_named():
    with pytest.raises(ConfigError, match="half_life must be > 0"):
        make_policy(4, 0)


@pytest.fixture
def installed():
    """The plugin in the process-wide manager: from its entry point where scripts/run-main-job installed it, else
    registered here as the entry point would register it."""
    manager = get_plugin_manager()
    if "decayed_lfu" in {info.name for info in manager.plugins()}:
        yield
        return
    manager.register(decayed_lfu_policy, "decayed_lfu")
    yield
    manager.unregister("decayed_lfu")


def test_passes_the_policy_contract_kit(installed):
    report = check_policy("decayed_lfu", options={"half_life": 3.0}, examples=15)
    assert report.passed, str(report)
    policy = create_eviction_policy("decayed_lfu", capacity=4, half_life=2.0)
    policy.on_insert(torch.tensor([0, 1]), torch.tensor([7, 8]), step=0)
    policy.on_access(torch.tensor([1]), torch.tensor([8]), torch.tensor([2]), step=1)
    assert policy.select_victims(1, torch.ones(4, dtype=torch.bool), step=2).tolist() == [0]

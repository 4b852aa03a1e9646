"""The checked wrapper: malformed answers and exceptions become PluginErrors, and leave the owner's state alone."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_plugin import SpecPlugin
from torchrec_ascend.errors import CapacityError, ConfigError, PluginError
from torchrec_ascend.policies.base import PolicySpec
from torchrec_ascend.policies.builtin.recency import LRU
from torchrec_ascend.policies.registry import create_admission_policy, create_eviction_policy
from torchrec_ascend.policies.validation import victims_ok, victims_problem

ALL = torch.ones(4, dtype=torch.bool)


def _filled(name):
    policy = create_eviction_policy(name, 4)
    policy.on_insert(torch.arange(4), torch.arange(4) + 100, step=0)
    return policy


@pytest.mark.parametrize(
    "name, evictable, problem",
    [
        ("broken_duplicates", ALL, r"returned slots \[\d\] more than once"),
        # every slot ties (all inserted at step 0) and ties go to the lowest slots: the two not evictable
        ("broken_evictable", torch.tensor([False, False, True, True]), "not evictable"),
    ],
)
def test_malformed_victims_name_plugin_method_and_version(broken_plugin, name, evictable, problem):
    policy = _filled(name)
    before = policy.resident.clone()
    with pytest.raises(PluginError) as err:
        policy.select_victims(2, evictable, step=1)
    message = str(err.value)
    assert f"eviction policy '{name}' from plugin 'broken_policies'" in message
    assert "select_victims(num=2)" in message and "(registered in-process" in message
    assert re.search(problem, message)
    assert torch.equal(policy.resident, before)  # nothing changed on the owner's side


@st.composite
def answers(draw: st.DrawFn) -> tuple:
    """A pool's residency and evictable masks, a victim count and an answer, well formed or not in any way."""
    capacity = draw(st.integers(1, 12))
    masks = st.lists(st.booleans(), min_size=capacity, max_size=capacity)
    resident, evictable = torch.tensor(draw(masks)), torch.tensor(draw(masks))
    allowed = (resident & evictable).nonzero().squeeze(1).tolist()
    well_formed = st.permutations(allowed).flatmap(lambda order: st.integers(0, len(order)).map(lambda k: order[:k]))
    anything = st.lists(st.integers(-2, capacity + 1), max_size=capacity + 2)
    victims = torch.tensor(draw(st.one_of(well_formed, anything)), dtype=torch.int64)
    victims = draw(st.sampled_from([victims, victims.to(torch.int32), victims.reshape(1, -1)]))
    num = draw(st.one_of(st.just(victims.numel()), st.integers(0, capacity)))
    return capacity, resident, evictable, num, victims


@settings(max_examples=400, deadline=None)
@given(answers())
def test_the_fast_victims_check_agrees_with_the_one_that_explains(answer):
    """victims_ok (every eviction) accepts exactly what victims_problem (which names the fault) finds no fault in."""
    capacity, resident, evictable, num, victims = answer
    allowed = resident & evictable
    ok = victims_ok(victims, num, capacity, allowed)
    assert ok == (victims_problem(victims, num, capacity, resident, evictable) is None)


def test_exceptions_are_wrapped_with_plugin_and_method(broken_plugin):
    policy = _filled("broken_crash")
    expected = r"'broken_policies'.*raised in select_victims of eviction policy 'broken_crash'"
    with pytest.raises(PluginError, match=expected):
        policy.select_victims(1, ALL, step=1)


def test_failed_insert_does_not_mark_slots_resident(register_plugin):
    class RefusesInserts(LRU):
        def on_insert(self, slots, keys, step, counts=None, signals=None):
            raise ValueError("refused")

    register_plugin(SpecPlugin([PolicySpec("refusing", "eviction", RefusesInserts)]), "refusing_plugin")
    policy = create_eviction_policy("refusing", 4)
    with pytest.raises(PluginError, match="raised in on_insert of eviction policy 'refusing': ValueError: refused"):
        policy.on_insert(torch.tensor([1]), torch.tensor([5]), step=0)
    assert not bool(policy.resident.any())


def test_asking_for_more_than_evictable_is_a_capacity_error():
    policy = _filled("lru")
    with pytest.raises(CapacityError, match="only 2 of 4 slots are resident and evictable"):
        policy.select_victims(3, torch.tensor([True, False, True, False]), step=1)


def test_expired_output_is_validated(register_plugin):
    class ExpiresEmptySlots(LRU):
        def expired(self, step):
            return (~self.resident).nonzero().squeeze(1)

    register_plugin(SpecPlugin([PolicySpec("ghostly", "eviction", ExpiresEmptySlots)]), "ghostly_plugin")
    policy = create_eviction_policy("ghostly", 4)
    policy.on_insert(torch.tensor([0, 1]), torch.tensor([5, 6]), step=0)
    with pytest.raises(PluginError, match=r"expired returned slots \[2, 3\] that are not resident"):
        policy.expired(step=1)


def test_state_dict_round_trip_includes_residency():
    policy = _filled("lfu")
    policy.on_remove(torch.tensor([2]))
    restored = create_eviction_policy("lfu", 4)
    restored.load_state_dict(policy.state_dict())
    assert restored.resident.tolist() == [True, True, False, True]
    assert torch.equal(restored.select_victims(3, ALL, 1), policy.select_victims(3, ALL, 1))
    with pytest.raises(ConfigError, match="'resident' mask"):
        create_eviction_policy("lfu", 8).load_state_dict(policy.state_dict())


def test_admission_mask_is_validated(broken_plugin):
    policy = create_admission_policy("broken_shape")
    with pytest.raises(PluginError, match=r"admission policy 'broken_shape'.*shape \(3,\), expected a bool tensor"):
        policy.admit(torch.tensor([1, 2]), torch.tensor([1, 1]), step=0)

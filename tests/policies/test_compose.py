"""Composition "a+b": slots expired in any component go first, the last component ranks the rest."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.policies.base import EvictionPolicy
from torchrec_ascend.policies.contract import EvictionDriver, steps_strategy
from torchrec_ascend.policies.registry import create_eviction_policy

ALL = torch.ones(4, dtype=torch.bool)


def _ttl_lfu():
    policy = create_eviction_policy("ttl+lfu", 4, ttl={"ttl_steps": 2})
    policy.on_insert(torch.arange(4), torch.arange(4) + 100, step=0, counts=torch.tensor([10, 1, 5, 7]))
    policy.on_access(torch.tensor([0]), torch.tensor([100]), torch.tensor([1]), step=5)
    return policy  # at step 6 slots 1, 2, 3 are expired (idle since step 0), slot 0 is not


def test_expired_first_ranked_by_the_last_component():
    assert sorted(_ttl_lfu().select_victims(2, ALL, step=6).tolist()) == [1, 2]  # lowest LFU counts among expired


def test_remaining_victims_by_the_ranker_when_few_expired():
    policy = _ttl_lfu()
    evictable = torch.tensor([True, True, False, False])
    assert sorted(policy.select_victims(2, evictable, step=6).tolist()) == [0, 1]
    assert policy.expired(step=6).tolist() == [1, 2, 3]


def test_state_dict_is_keyed_by_component():
    state = _ttl_lfu().state_dict()
    assert {k.split(".")[0] for k in state} == {"ttl", "lfu"}
    restored = create_eviction_policy("ttl+lfu", 4, ttl={"ttl_steps": 2})
    restored.load_state_dict(state)
    assert sorted(restored.select_victims(2, ALL, step=6).tolist()) == [1, 2]


class ExpiredFirst(EvictionPolicy):
    """Forwards to a composite; checks that expired evictable slots are always taken before others."""

    def __init__(self, policy):
        super().__init__(policy.capacity)
        self.policy = policy

    def on_insert(self, *args, **kwargs):
        self.policy.on_insert(*args, **kwargs)

    def on_access(self, *args, **kwargs):
        self.policy.on_access(*args, **kwargs)

    def on_remove(self, slots):
        self.policy.on_remove(slots)

    def expired(self, step):
        return self.policy.expired(step)

    def select_victims(self, num, evictable, step):
        nominated = set(self.policy.expired(step).tolist()) & set(evictable.nonzero().squeeze(1).tolist())
        victims = set(self.policy.select_victims(num, evictable, step).tolist())
        assert victims <= nominated if len(nominated) >= num else nominated <= victims, (victims, nominated)
        return torch.tensor(sorted(victims), dtype=torch.int64)


@settings(deadline=None, max_examples=40)
@given(steps=steps_strategy(st.integers(0, 12), capacity=5, max_steps=14), ttl=st.integers(0, 3))
def test_expired_slots_always_go_first(steps, ttl):
    policy = create_eviction_policy("ttl+lfu", 5, ttl={"ttl_steps": ttl})
    EvictionDriver(ExpiredFirst(policy)).run(steps)

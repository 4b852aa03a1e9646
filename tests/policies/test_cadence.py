"""EvictionCadence: how much to evict when, and the minimum-residency protection against thrashing."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.cadence import EvictionCadence
from torchrec_ascend.policies.registry import create_eviction_policy


def test_forced_between_cadence_steps_bulk_with_headroom_on_them():
    cadence = EvictionCadence(1000, interval=10, headroom=0.05)
    assert cadence.num_to_evict(num_free=100, num_needed=300, num_evictable=800, step=7) == 200
    assert cadence.num_to_evict(num_free=400, num_needed=300, num_evictable=500, step=7) == 0
    assert cadence.num_to_evict(num_free=100, num_needed=300, num_evictable=800, step=10) == 250  # 50 left free
    assert cadence.num_to_evict(num_free=100, num_needed=300, num_evictable=220, step=20) == 220  # bounded
    assert cadence.num_to_evict(num_free=0, num_needed=300, num_evictable=250, step=20) == 300  # forced wins


def _lfu_with_young_slots():
    policy = create_eviction_policy("lfu", 4)
    cadence = EvictionCadence(4, min_residency=3)
    for slots, step, counts in (([0, 1], 0, [5, 5]), ([2, 3], 5, [1, 1])):
        slots = torch.tensor(slots)
        policy.on_insert(slots, slots + 100, step, counts=torch.tensor(counts))
        cadence.on_insert(slots, step)
    return policy, cadence  # LFU alone would evict the young slots 2 and 3 first


def test_young_slots_are_protected_when_mature_ones_suffice():
    policy, cadence = _lfu_with_young_slots()
    assert sorted(cadence.select(policy, 2, torch.ones(4, dtype=torch.bool), step=6).tolist()) == [0, 1]
    assert cadence.stats["young_evicted"] == 0


def test_young_slots_are_evicted_only_when_nothing_else_is_left():
    policy, cadence = _lfu_with_young_slots()
    victims = cadence.select(policy, 3, torch.ones(4, dtype=torch.bool), step=6).tolist()
    assert set(victims[:2]) == {0, 1} and victims[2] in (2, 3)
    assert cadence.stats["young_evicted"] == 1
    assert sorted(cadence.select(policy, 2, torch.ones(4, dtype=torch.bool), step=8).tolist()) == [2, 3]  # aged


@settings(deadline=None)
@given(
    inserted=st.lists(st.integers(0, 10), min_size=6, max_size=6),
    pinned=st.lists(st.booleans(), min_size=6, max_size=6),
    num=st.integers(0, 6),
    min_residency=st.integers(0, 5),
)
def test_protection_invariant(inserted, pinned, num, min_residency):
    policy, cadence = create_eviction_policy("lru", 6), EvictionCadence(6, min_residency=min_residency)
    for slot, step in enumerate(inserted):
        policy.on_insert(torch.tensor([slot]), torch.tensor([slot]), step)
        cadence.on_insert(torch.tensor([slot]), step)
    evictable = ~torch.tensor(pinned)
    num = min(num, int(evictable.sum()))
    victims = set(cadence.select(policy, num, evictable, step=10).tolist())
    young = {s for s, step in enumerate(inserted) if step > 10 - min_residency and not pinned[s]}
    mature = {s for s in range(6) if not pinned[s]} - young
    assert len(victims) == num and not any(pinned[s] for s in victims)
    assert victims <= mature if num <= len(mature) else mature <= victims


def test_state_round_trip_keeps_the_protection():
    policy, cadence = _lfu_with_young_slots()
    restored = EvictionCadence(4, min_residency=3)
    restored.load_state_dict(cadence.state_dict())
    assert sorted(restored.select(policy, 2, torch.ones(4, dtype=torch.bool), step=6).tolist()) == [0, 1]
    with pytest.raises(ConfigError, match="same capacity"):
        EvictionCadence(5).load_state_dict(cadence.state_dict())


@pytest.mark.parametrize(
    "options, message",
    [({"interval": 0}, "interval"), ({"min_residency": -1}, "min_residency"), ({"headroom": 1.0}, "headroom")],
)
def test_bad_options(options, message):
    with pytest.raises(ConfigError, match=message):
        EvictionCadence(10, **options)

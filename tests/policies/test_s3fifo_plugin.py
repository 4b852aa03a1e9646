"""The example third-party distribution torchrec-ascend-s3fifo: discovered through its entry point, and correct."""

from __future__ import annotations

import importlib.util
from collections import deque

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.policies.contract import check_policy
from torchrec_ascend.policies.registry import create_eviction_policy, list_policies

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchrec_ascend_s3fifo") is None,
    reason="torchrec-ascend-s3fifo is not installed: .venv/bin/pip install --no-build-isolation -e plugins/s3fifo",
)

ALL = torch.ones(8, dtype=torch.bool)


def test_listed_with_its_own_distribution():
    (entry,) = [e for e in list_policies("eviction") if e.name == "s3fifo"]
    assert (entry.distribution, entry.version, entry.plugin.name) == ("torchrec-ascend-s3fifo", "0.1.0", "s3fifo")


def test_passes_the_contract_kit():
    report = check_policy("s3fifo", options={"small_fraction": 0.3}, examples=15)
    assert report.passed, str(report)


def _insert(policy, slots, keys, step):
    policy.on_insert(torch.tensor(slots), torch.tensor(keys), step)


def test_one_hit_wonders_leave_before_reused_keys():
    policy = create_eviction_policy("s3fifo", 8, small_fraction=0.125)  # the small queue's target is 1 slot
    _insert(policy, list(range(8)), list(range(100, 108)), step=0)
    policy.on_access(torch.tensor([0, 1, 2]), torch.tensor([100, 101, 102]), torch.ones(3, dtype=torch.int64), 1)
    victims = set(policy.select_victims(5, ALL, step=2).tolist())
    assert victims == {3, 4, 5, 6, 7}


def test_keys_remembered_by_the_ghost_return_to_the_main_queue():
    policy = create_eviction_policy("s3fifo", 8)
    _insert(policy, [0, 1], [100, 101], step=0)
    victim = policy.select_victims(1, ALL, step=1)
    policy.on_remove(victim)  # evicted from the small queue: remembered by the ghost
    returning = int(victim) + 100
    _insert(policy, [int(victim)], [returning], step=2)
    assert bool(policy.policy.in_main[int(victim)])


@settings(deadline=None)
@given(freqs=st.lists(st.integers(0, 3), min_size=1, max_size=8), num=st.integers(1, 8))
def test_main_queue_sweep_matches_sequential_clock(freqs, num):
    """The closed-form sweep equals CLOCK run one slot at a time (all slots in the main queue, in slot order)."""
    n, num = len(freqs), min(num, len(freqs))
    policy = create_eviction_policy("s3fifo", 8).policy
    slots = torch.arange(n)
    policy.on_insert(slots, slots + 100, step=0)
    policy.in_main[slots] = True
    policy.freq[slots] = torch.tensor(freqs)
    queue, freq, evicted = deque(range(n)), list(freqs), []
    while len(evicted) < num:
        s = queue.popleft()
        if freq[s] > 0:
            freq[s] -= 1
            queue.append(s)
        else:
            evicted.append(s)
    victims = policy.select_victims(num, ALL, step=1)
    assert sorted(victims.tolist()) == sorted(evicted)
    survivors = sorted(queue, key=lambda s: int(policy.position[s]))
    assert survivors == list(queue)  # same queue order after the sweep
    assert [int(policy.freq[s]) for s in queue] == [freq[s] for s in queue]

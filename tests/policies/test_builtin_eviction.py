"""Built-in eviction policies against plain-Python reference rankings, plus targeted behaviour checks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_reference import (
    EpochLFURef,
    EpochLRURef,
    LFURef,
    LRURef,
    ReferenceTee,
    ShowClickRef,
    TTLRef,
    collision_free_size,
)
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.builtin.frequency import LFU, EpochLFU
from torchrec_ascend.policies.builtin.recency import LRU, EpochLRU
from torchrec_ascend.policies.builtin.showclick import ShowClickEviction
from torchrec_ascend.policies.builtin.ttl import TTL
from torchrec_ascend.policies.contract import EvictionDriver, steps_strategy

CAPACITY = 6
KEYS = st.one_of(st.integers(0, 3 * CAPACITY), st.integers(2**63 - 4, 2**63 - 1))


# a history table in which the test's keys never collide, so LFU's history is exact (the model's)
HISTORY = collision_free_size(list(range(3 * CAPACITY + 1)) + [2**63 - 4 + i for i in range(4)])


CASES = {
    "lru": (lambda: LRU(CAPACITY), LRURef, 0.0),
    "lfu": (lambda: LFU(CAPACITY), LFURef, 0.0),
    "lfu_history": (lambda: LFU(CAPACITY, history=HISTORY), lambda: LFURef(history=True), 0.0),
    "epoch_lru": (lambda: EpochLRU(CAPACITY, epoch_steps=3), lambda: EpochLRURef(3), 0.0),
    "epoch_lfu": (lambda: EpochLFU(CAPACITY, epoch_steps=3), lambda: EpochLFURef(3), 0.0),
    "ttl": (lambda: TTL(CAPACITY, ttl_steps=2), lambda: TTLRef(2), 0.0),
    "showclick": (
        lambda: ShowClickEviction(CAPACITY, alpha=1.0, beta=3.0, score_decay=0.8, evict_percentage=0.3),
        lambda: ShowClickRef(1.0, 3.0, 0.8, 0.3),
        1e-9,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
@settings(deadline=None, max_examples=40)
@given(steps=steps_strategy(KEYS, CAPACITY, max_steps=14))
def test_victims_rank_lowest_by_reference(name, steps):
    make, make_ref, tolerance = CASES[name]
    EvictionDriver(ReferenceTee(make(), make_ref(), tolerance)).run(steps)


@pytest.mark.parametrize("name", sorted(CASES))
@settings(deadline=None, max_examples=25)
@given(steps=steps_strategy(KEYS, CAPACITY, max_steps=14), later=st.integers(0, 40))
def test_a_state_dict_round_trip_keeps_every_score(name, steps, later):
    make, _, _ = CASES[name]
    policy = make()
    EvictionDriver(policy).run(steps)
    state = policy.state_dict()
    restored = make()
    restored.load_state_dict({k: v.clone() for k, v in state.items()})
    assert state.keys() == restored.state_dict().keys()
    assert all(torch.equal(v, restored.state_dict()[k]) for k, v in state.items())
    step = len(steps) + later
    assert torch.equal(restored.scores(step), policy.scores(step))


@pytest.mark.parametrize("name, number", [("epoch_lru", "inserted"), ("epoch_lfu", "count")])
@settings(deadline=None, max_examples=25)
@given(steps=steps_strategy(KEYS, CAPACITY, max_steps=14))
def test_epoch_policies_save_each_slots_epoch_and_number_as_the_reference_holds_them(name, number, steps):
    make, make_ref, _ = CASES[name]
    tee = ReferenceTee(make(), make_ref())
    EvictionDriver(tee).run(steps)
    state = tee.policy.state_dict()
    saved = {"epoch": state["last_epoch"], number: state[tee.policy.state_names[1]]}
    for slot, meta in tee.ref.meta.items():
        assert {k: int(v[slot]) for k, v in saved.items()} == {"epoch": meta["epoch"], number: meta[number]}


def _insert(policy, slots, step, counts=None):
    slots = torch.tensor(slots)
    policy.on_insert(slots, slots + 100, step, counts=None if counts is None else torch.tensor(counts))


ALL = torch.ones(4, dtype=torch.bool)


def test_lru_evicts_least_recent():
    lru = LRU(4)
    _insert(lru, [0, 1, 2, 3], step=0)
    lru.on_access(torch.tensor([0, 2]), torch.tensor([100, 102]), torch.tensor([1, 1]), step=1)
    assert sorted(lru.select_victims(2, ALL, step=2).tolist()) == [1, 3]


def test_lfu_history_restores_counts_of_returning_keys():
    lfu = LFU(4, history=64)
    _insert(lfu, [0, 1], step=0, counts=[9, 1])
    lfu.on_remove(torch.tensor([0]))  # key 100 leaves with count 9
    _insert(lfu, [2], step=1)  # a newcomer with count 1
    lfu.on_insert(torch.tensor([0]), torch.tensor([100]), step=2)  # key 100 returns: 9 + 1
    assert int(lfu.count[0]) == 10
    assert lfu.select_victims(1, ALL, step=3).tolist() == [1]


def test_epoch_lfu_forgets_counts_of_past_epochs():
    policy = EpochLFU(4, epoch_steps=10)
    _insert(policy, [0, 1], step=0, counts=[50, 1])
    policy.on_access(torch.tensor([1]), torch.tensor([101]), torch.tensor([1]), step=10)  # new epoch
    # slot 0's 50 accesses belong to epoch 0: slot 1 (used in epoch 1) outranks it
    assert policy.select_victims(1, ALL, step=11).tolist() == [0]


def test_ttl_wall_clock_expires_idle_slots():
    now = [100.0]
    ttl = TTL(4, ttl_seconds=5.0, clock=lambda: now[0])
    _insert(ttl, [0, 1], step=0)
    now[0] = 103.0
    ttl.on_access(torch.tensor([1]), torch.tensor([101]), torch.tensor([1]), step=1)
    now[0] = 105.5
    assert ttl.expired(step=2).tolist() == [0]


def test_showclick_clicks_protect_slots():
    policy = ShowClickEviction(4, alpha=1.0, beta=10.0)
    slots = torch.tensor([0, 1])
    policy.on_insert(slots, slots + 100, step=0, signals={"clicks": torch.tensor([1, 0])})
    assert policy.select_victims(1, ALL, step=1).tolist() == [1]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: TTL(4), "exactly one of"),
        (lambda: TTL(4, ttl_steps=1.5), "ttl_steps"),
        (lambda: EpochLRU(4, epoch_steps=0), "epoch_steps"),
        (lambda: ShowClickEviction(4, score_decay=1.5), "score_decay"),
        (lambda: LFU(4, history=-1), "history"),
        (lambda: LRU(0), "capacity"),
    ],
)
def test_bad_options_are_config_errors_naming_the_option(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_state_dict_is_a_copy():
    lru = LRU(4)
    _insert(lru, [0], step=0)
    state = lru.state_dict()
    lru.on_access(torch.tensor([0]), torch.tensor([100]), torch.tensor([1]), step=7)
    assert int(state["last_step"][0]) == 0


def test_load_state_dict_rejects_other_capacity():
    with pytest.raises(ConfigError, match="same capacity"):
        LRU(4).load_state_dict(LRU(5).state_dict())

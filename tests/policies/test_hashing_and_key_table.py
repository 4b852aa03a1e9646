"""mix64 against the unsigned SplitMix64 definition; BoundedKeyScores against a dict model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_reference import collision_free_size
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.hashing import mix64, uniform
from torchrec_ascend.policies.key_table import BoundedKeyScores

M64 = (1 << 64) - 1
KEY = st.integers(0, 2**63 - 1)


def splitmix64_reference(key: int, seed: int) -> int:
    z = (key + 0x9E3779B97F4A7C15 * (seed + 1)) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


@settings(deadline=None)
@given(keys=st.lists(KEY, max_size=20), seed=st.integers(0, 1000))
def test_mix64_matches_unsigned_reference(keys, seed):
    got = mix64(torch.tensor(keys, dtype=torch.int64), seed).tolist()
    assert got == [splitmix64_reference(k, seed) for k in keys]


def test_mix64_rejects_non_int64():
    with pytest.raises(TypeError, match="int64"):
        mix64(torch.tensor([1.0]))


def test_uniform_in_unit_interval_and_roughly_uniform():
    u = uniform(torch.arange(100_000, dtype=torch.int64), seed=3)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01  # 0.5 +- 3.5 sigma (sigma ~ 0.0009)


ops = st.lists(
    st.tuples(st.lists(st.integers(0, 30), max_size=10, unique=True), st.sampled_from(["add", "discard"])),
    max_size=15,
)


def run_ops(table, ops, amount):
    """Apply ``ops`` to ``table`` and to a dict model; returns the model and, per key added, the amount added, the
    total the table returned and the model's true total."""
    truth, adds = {}, []
    for keys, op in ops:
        t = torch.tensor(keys, dtype=torch.int64)
        if op == "discard":
            table.discard(t)
            for k in keys:
                truth.pop(k, None)
            continue
        amounts = [amount(k) for k in keys]
        totals = table.add(t, torch.tensor(amounts, dtype=torch.float64)).tolist()
        for k, a, total in zip(keys, amounts, totals):
            truth[k] = truth.get(k, 0.0) + a
            adds.append((a, total, truth[k]))
    return truth, adds


@settings(deadline=None)
@given(ops=ops, size=st.integers(1, 8))
def test_scores_are_never_inflated(ops, size):
    """Under heavy collisions (tiny table) a returned total never exceeds the true accumulated amount."""
    table = BoundedKeyScores(size)
    _, adds = run_ops(table, ops, lambda k: 1.0 + (k % 3))
    assert all(a <= total <= true for a, total, true in adds)
    assert len(table) <= size


@settings(deadline=None)
@given(ops=ops)
def test_exact_without_collisions(ops):
    table = BoundedKeyScores(collision_free_size(list(range(31))))
    truth, adds = run_ops(table, ops, lambda k: 1.0)
    assert all(total == true for _, total, true in adds)
    probe = torch.arange(31)
    assert table.lookup(probe).tolist() == [float(truth.get(k, 0)) for k in range(31)]


def test_state_round_trip_and_size_check():
    table = BoundedKeyScores(16)
    table.add(torch.tensor([3, 2**63 - 1]), torch.tensor([2.0, 5.0]))
    copy = BoundedKeyScores(16)
    copy.load_state_dict(table.state_dict())
    assert copy.lookup(torch.tensor([3, 2**63 - 1])).tolist() == [2.0, 5.0]
    with pytest.raises(ConfigError, match="same size"):
        BoundedKeyScores(8).load_state_dict(table.state_dict())
    with pytest.raises(ConfigError, match="positive integer size"):
        BoundedKeyScores(0)

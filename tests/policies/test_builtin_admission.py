"""Built-in admission policies against a dict reference, and their invariants under collisions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_reference import collision_free_size
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.builtin.admission import CountAdmission, ProbabilisticAdmission
from torchrec_ascend.policies.builtin.showclick import ShowClickAdmission

POOL = 25
batches = st.lists(
    st.lists(
        st.tuples(st.integers(0, POOL - 1), st.integers(1, 3), st.integers(0, 2)), max_size=8, unique_by=lambda t: t[0]
    ),
    max_size=12,
)


def _replay(policy, batches, amount):
    """Drive ``policy`` as a table owner; return (key, admitted, true accumulated amount) per decision."""
    table, truth, decisions = set(), {}, []
    for step, batch in enumerate(batches):
        batch = [b for b in batch if b[0] not in table]
        keys = torch.tensor([b[0] for b in batch], dtype=torch.int64)
        counts = torch.tensor([b[1] for b in batch], dtype=torch.int64)
        clicks = torch.tensor([b[2] for b in batch], dtype=torch.int64)
        mask = policy.admit(keys, counts, step, {"clicks": clicks})
        assert mask.dtype == torch.bool and mask.shape == keys.shape
        for (k, c, cl), ok in zip(batch, mask.tolist()):
            truth[k] = truth.get(k, 0.0) + amount(c, cl)
            decisions.append((k, ok, truth[k]))
            if ok:
                table.add(k)
                truth.pop(k)
    return decisions


EXACT_SIZE = collision_free_size(list(range(POOL)))  # pending counts are exact: compare with the dict


@settings(deadline=None)
@given(batches=batches, threshold=st.integers(1, 5))
def test_count_admission_matches_dict_reference(batches, threshold):
    for key, admitted, total in _replay(CountAdmission(threshold, max_tracked=EXACT_SIZE), batches, lambda c, cl: c):
        assert admitted == (total >= threshold), (key, total)


@settings(deadline=None)
@given(batches=batches, threshold=st.integers(1, 5), size=st.integers(1, 4))
def test_count_admission_never_admits_early_under_collisions(batches, threshold, size):
    for key, admitted, total in _replay(CountAdmission(threshold, max_tracked=size), batches, lambda c, cl: c):
        assert not admitted or total >= threshold, (key, total)


@settings(deadline=None)
@given(batches=batches, threshold=st.floats(0.0, 6.0))
def test_showclick_admission_matches_dict_reference(batches, threshold):
    policy = ShowClickAdmission(alpha=0.5, beta=2.0, threshold=threshold, max_tracked=EXACT_SIZE)
    for key, admitted, total in _replay(policy, batches, lambda c, cl: 0.5 * c + 2.0 * cl):
        assert admitted == (total >= threshold - 1e-12), (key, total)


def test_probabilistic_is_a_function_of_seed_key_and_step():
    keys, counts = torch.arange(50_000, dtype=torch.int64), torch.ones(50_000, dtype=torch.int64)
    a = ProbabilisticAdmission(0.3, seed=5)
    first = a.admit(keys, counts, step=4)
    assert torch.equal(first, ProbabilisticAdmission(0.3, seed=5).admit(keys, counts, step=4))
    assert not torch.equal(first, a.admit(keys, counts, step=5))  # a fresh chance at another step
    assert not torch.equal(first, ProbabilisticAdmission(0.3, seed=6).admit(keys, counts, step=4))
    assert abs(float(first.double().mean()) - 0.3) < 0.01  # binomial: sigma ~ 0.002
    assert not bool(ProbabilisticAdmission(0.0).admit(keys, counts, 0).any())
    assert bool(ProbabilisticAdmission(1.0).admit(keys, counts, 0).all())


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: CountAdmission(threshold=0), "threshold"),
        (lambda: CountAdmission(max_tracked=2.5), "max_tracked"),
        (lambda: ShowClickAdmission(alpha=-1.0), "alpha"),
        (lambda: ProbabilisticAdmission(probability=1.2), "probability"),
    ],
)
def test_bad_options_name_the_option(make, message):
    with pytest.raises(ConfigError, match=message):
        make()

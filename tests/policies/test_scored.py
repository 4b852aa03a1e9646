"""``scored.lowest``, the victim choice of every scored policy, against a plain-Python ranking.

Property (hypothesis): for any scores (int64 up to its largest value, float64 up to ``inf``; the narrower dtypes
policies may keep, widened exactly), candidate mask and ``num``, the chosen slots are distinct candidates,
``min(num, candidates)`` of them, and no candidate left out scores lower than a chosen one.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.policies.scored import lowest

INT64_MAX = 2**63 - 1
INTS = st.one_of(st.integers(-5, 5), st.just(INT64_MAX))
FLOATS = st.one_of(st.floats(-5, 5), st.just(float("inf")))


@st.composite
def problems(draw: st.DrawFn) -> tuple:
    size = draw(st.integers(1, 24))
    floating = draw(st.booleans())
    values = draw(st.lists(FLOATS if floating else INTS, min_size=size, max_size=size))
    dtype = draw(st.sampled_from([torch.float64, torch.float32]) if floating else st.just(torch.int64))
    if not floating and all(-5 <= v <= 5 for v in values):
        dtype = draw(st.sampled_from([torch.int64, torch.int32, torch.int16, torch.int8]))
    scores = torch.tensor(values, dtype=dtype)
    candidates = torch.tensor(draw(st.lists(st.booleans(), min_size=size, max_size=size)))
    return scores, candidates, draw(st.integers(0, size + 2))


@settings(max_examples=300, deadline=None)
@given(problems())
def test_lowest_chooses_the_lowest_scoring_candidates(problem: tuple) -> None:
    scores, candidates, num = problem
    chosen = lowest(scores, candidates, num).tolist()
    pool = [slot for slot in range(scores.numel()) if candidates[slot]]
    assert len(set(chosen)) == len(chosen) == min(max(num, 0), len(pool))
    assert set(chosen) <= set(pool)
    left = [scores[slot].item() for slot in pool if slot not in chosen]
    if chosen and left:
        assert max(scores[slot].item() for slot in chosen) <= min(left)


def test_candidates_at_the_largest_score_are_still_chosen_and_ties_go_to_the_lowest_slots() -> None:
    """Every slot at int64's largest value: only candidates are chosen, the lowest slots first."""
    scores = torch.full((8,), INT64_MAX)
    candidates = torch.tensor([False, True, False, True, True, False, False, False])
    assert sorted(lowest(scores, candidates, 2).tolist()) == [1, 3]

"""select_lowest (the eviction policies' victim choice) against its plain-Python reference, a stable sort.

The native op is a radix selection on order-preserving 64-bit keys: the properties below draw scores that share
long runs of high bits (so selection takes several passes), ties, the int64 extremes, and the float64 specials
(NaN, infinities, -0.0, subnormals), and require the exact reference set: the first ``num`` candidates by
(score, position).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.native import ops, reference

BASE = 0x5A5A_0000_0000_0000  # a shared high part: the keys differ only in their low bits
INTS = st.one_of(
    st.integers(-3, 3),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 2**20).map(lambda low: BASE + low),
    st.sampled_from([-(2**63), 2**63 - 1]),
)
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, math.nan, -math.nan, math.inf, -math.inf, 5e-324, -5e-324]),
    st.integers(0, 2**16).map(lambda low: 1.0 + low * 2.0**-52),
)


@st.composite
def problems(draw: st.DrawFn) -> tuple:
    floating = draw(st.booleans())
    values = draw(st.lists(FLOATS if floating else INTS, max_size=300))
    scores = torch.tensor(values, dtype=torch.float64 if floating else torch.int64)
    flags = draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values)))
    # Mostly fewer than the candidates (a choice to make), sometimes all of them or more.
    num = draw(st.one_of(st.integers(0, max(0, sum(flags) - 1)), st.integers(0, len(values) + 2)))
    return scores, torch.tensor(flags, dtype=torch.bool), num


@settings(max_examples=300, deadline=None)
@given(problems())
def test_select_lowest_is_the_first_candidates_of_a_stable_sort(problem: tuple) -> None:
    scores, candidates, num = problem
    got = ops.select_lowest(scores, candidates, num)
    assert got.dtype == torch.int64
    assert sorted(got.tolist()) == sorted(reference.select_lowest(scores, candidates, num).tolist())


KEYS = st.one_of(st.integers(-3, 8), st.integers(-(2**63), 2**63 - 1), st.sampled_from([2**31 - 1, 2**31, 2**32 - 1,
                                                                                       2**32, -(2**63)]))


@st.composite
def packed_problems(draw: st.DrawFn) -> tuple:
    size = draw(st.integers(0, 200))
    keys = st.lists(KEYS, min_size=size, max_size=size)
    flags = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    num = draw(st.one_of(st.integers(0, max(0, sum(flags) - 1)), st.integers(0, size + 2)))
    high, low = (torch.tensor(draw(keys), dtype=torch.int64) for _ in range(2))
    return high, low, torch.tensor(flags, dtype=torch.bool), num


@settings(max_examples=300, deadline=None)
@given(packed_problems())
def test_select_lowest_packed_ranks_the_saturated_pairs(problem: tuple) -> None:
    """Keys past the saturation bounds (and negative ones) tie with the bound, as the policies' pack() has them."""
    high, low, candidates, num = problem
    got = ops.select_lowest_packed(high, low, candidates, num)
    assert sorted(got.tolist()) == sorted(reference.select_lowest_packed(high, low, candidates, num).tolist())


def test_select_lowest_on_a_cache_sized_mask_with_many_ties() -> None:
    """5,000 slots over 7 step values (an LRU cache's last-use steps): the ties go to the lowest slots."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(100, 107, (5000,), generator=generator)
    candidates = torch.rand(5000, generator=generator) < 0.8
    got = ops.select_lowest(scores, candidates, 1800)
    assert torch.equal(got.sort().values, reference.select_lowest(scores, candidates, 1800).sort().values)


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((torch.zeros(3, dtype=torch.int32), torch.ones(3, dtype=torch.bool), 1), TypeError, "int64 or float64"),
        ((torch.zeros(3, dtype=torch.int64), torch.ones(3, dtype=torch.uint8), 1), TypeError, "must be bool"),
        ((torch.zeros(3, dtype=torch.int64), torch.ones(2, dtype=torch.bool), 1), ValueError, "one length"),
        ((torch.zeros(3, dtype=torch.int64), torch.ones(3, dtype=torch.bool), -1), ValueError, "`num` must be >= 0"),
    ],
)
def test_select_lowest_names_the_rule_broken(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        ops.select_lowest(*args)


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((torch.zeros(3, dtype=torch.int32), torch.zeros(3), torch.ones(3, dtype=torch.bool), 1), TypeError, "int64"),
        ((torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), torch.ones(3), 1), TypeError, "bool"),
        ((torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), torch.ones(3, dtype=torch.bool), 1),
         ValueError, "one length"),
        ((torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), torch.ones(3, dtype=torch.bool), -1),
         ValueError, "`num` must be >= 0"),
    ],
)
def test_select_lowest_packed_names_the_rule_broken(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        ops.select_lowest_packed(*args)

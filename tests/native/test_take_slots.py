"""take_slots (the checked eviction wrapper's test of a policy's victims) against its plain-Python reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.native import ops, reference


@st.composite
def problems(draw: st.DrawFn) -> tuple:
    """A mask and slots: some distinct and set, some repeated, unset or outside the mask (either end)."""
    size = draw(st.integers(0, 40))
    flags = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    slots = draw(st.lists(st.integers(-3, size + 2), max_size=size + 3))
    return torch.tensor(flags, dtype=torch.bool), torch.tensor(slots, dtype=torch.int64)


@settings(max_examples=300, deadline=None)
@given(problems())
def test_take_slots_agrees_with_the_reference_in_answer_and_mask(problem: tuple) -> None:
    free, slots = problem
    expected_free = free.clone()
    expected = reference.take_slots(expected_free, slots)
    assert ops.take_slots(free, slots) == expected
    assert torch.equal(free, expected_free)


def test_distinct_set_slots_are_taken_and_a_repeat_or_a_negative_slot_is_not() -> None:
    free = torch.ones(6, dtype=torch.bool)
    assert ops.take_slots(free, torch.tensor([4, 1]))
    assert free.tolist() == [True, False, True, True, False, True]
    assert not ops.take_slots(free.clone(), torch.tensor([0, 0]))
    assert not ops.take_slots(free.clone(), torch.tensor([-1]))  # not the last slot, as indexing would read it
    assert not ops.take_slots(free.clone(), torch.tensor([6]))


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((torch.ones(3, dtype=torch.uint8), torch.tensor([0])), TypeError, "must be bool"),
        ((torch.ones(3, dtype=torch.bool), torch.tensor([0], dtype=torch.int32)), TypeError, "int64"),
        ((torch.ones(2, 2, dtype=torch.bool), torch.tensor([0])), ValueError, "1-D"),
        ((torch.ones(4, dtype=torch.bool)[::2], torch.tensor([0])), ValueError, "contiguous"),
    ],
)
def test_take_slots_names_the_rule_broken(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        ops.take_slots(*args)

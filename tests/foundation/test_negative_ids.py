"""The one negative-ID check. Oracle: a plain-Python scan of the IDs for the first negative one and its feature."""

from __future__ import annotations

import itertools
from typing import List

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.errors import InputError, check_non_negative_ids


def _never() -> List[int]:
    raise AssertionError("offsets were read although every ID is non-negative")


@settings(deadline=None, max_examples=50)
@given(st.lists(st.lists(st.integers(-3, 2**63 - 1), max_size=5), min_size=1, max_size=4))
def test_names_the_feature_and_table_of_the_first_negative_id(per_feature: List[List[int]]) -> None:
    features = [f"f{i}" for i in range(len(per_feature))]
    ids = torch.tensor([x for ids in per_feature for x in ids], dtype=torch.int64)
    ends = list(itertools.accumulate(len(ids_) for ids_ in per_feature))
    first = next(((f, x) for f, ids_ in zip(features, per_feature) for x in ids_ if x < 0), None)
    if first is None:
        check_non_negative_ids(ids, features, _never, lambda feature: "t")  # ends never read: no extra sync
        return
    with pytest.raises(InputError) as caught:
        check_non_negative_ids(ids, features, lambda: ends, lambda feature: f"table_of_{feature}")
    feature, value = first
    assert str(caught.value).startswith(f"hash table 'table_of_{feature}', feature '{feature}': IDs must be "
                                        f"non-negative int64, got {value}.")
    assert isinstance(caught.value, ValueError), "callers catching ValueError keep working"

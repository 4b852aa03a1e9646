"""leave_one_out against a plain-Python reference: per user, sort by (timestamp, file position), hold out the last."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.datasets import Interactions, leave_one_out
from torchrec_ascend.errors import ConfigError

# (user, item, timestamp) rows; few distinct timestamps so that ties are common.
rows_strategy = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 2**40), st.integers(0, 4)), min_size=1, max_size=60
)


def interactions(rows):
    users, items, stamps = zip(*rows)
    return Interactions(torch.tensor(users), torch.tensor(items), torch.ones(len(rows)),
                        torch.tensor(stamps, dtype=torch.float64))


def reference(rows):
    by_user = {}
    for position, (user, item, stamp) in enumerate(rows):
        by_user.setdefault(user, []).append((stamp, position, item))
    return {user: [item for _, _, item in sorted(events)] for user, events in sorted(by_user.items())}


@settings(deadline=None, max_examples=60)
@given(rows_strategy)
def test_matches_reference(rows):
    expected = reference(rows)
    if min(len(items) for items in expected.values()) < 2:
        with pytest.raises(ConfigError, match="at least 2 interactions"):
            leave_one_out(interactions(rows))
        return
    split = leave_one_out(interactions(rows))
    assert split.users.tolist() == list(expected)
    for index, items in enumerate(expected.values()):
        assert split.train_sequence(index).tolist() == items[:-1]
        assert int(split.held_out[index]) == items[-1]
    assert split.offsets[0] == 0 and split.offsets[-1] == split.items.numel() == len(rows) - len(expected)

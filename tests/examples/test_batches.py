"""Training windows, batches and evaluation helpers of the HSTU example, against plain-Python references."""

import math

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from batches import IGNORE, PAD, TrainBatches, make_batch, recent_history, training_windows
from embedding_tables import CANDIDATES, HISTORY
from evaluate import my_users, ranking_sums, training_item_mask
from torchrec_ascend.datasets import UserSequences


def sequences(lengths):
    """Users with the given training lengths; item values are unique (their global position + 1)."""
    lengths = torch.tensor(lengths)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    items = torch.arange(1, int(offsets[-1]) + 1)
    return UserSequences(torch.arange(len(lengths)), offsets, items, torch.zeros(len(lengths), dtype=torch.int64))


lengths_strategy = st.lists(st.integers(1, 25), min_size=1, max_size=8)


@settings(deadline=None, max_examples=50)
@given(lengths=lengths_strategy, max_seq_len=st.integers(1, 7))
def test_windows_cover_every_transition_once(lengths, max_seq_len):
    split = sequences(lengths)
    windows = training_windows(split, max_seq_len)
    assert windows.shape[1] == max_seq_len + 1
    seen = []
    for row in windows.tolist():
        items = [i for i in row if i != PAD]
        assert len(items) >= 2 and row[: len(items)] == items  # right-padded, at least one transition
        assert items == list(range(items[0], items[0] + len(items)))  # contiguous
        seen += list(zip(items, items[1:]))
    expected = []
    for user in range(len(lengths)):
        items = split.train_sequence(user).tolist()
        expected += list(zip(items, items[1:]))
    assert sorted(seen) == sorted(expected)


@settings(deadline=None, max_examples=30)
@given(lengths=lengths_strategy, max_seq_len=st.integers(1, 7), data=st.data())
def test_recent_history_is_the_tail(lengths, max_seq_len, data):
    split = sequences(lengths)
    users = torch.tensor(data.draw(st.lists(st.integers(0, len(lengths) - 1), min_size=1, max_size=5)))
    rows = recent_history(split, users, max_seq_len).tolist()
    for user, row in zip(users.tolist(), rows):
        tail = split.train_sequence(user).tolist()[-max_seq_len:]
        assert row == tail + [PAD] * (max_seq_len - len(tail))


def test_make_batch_labels_point_at_targets():
    windows = torch.tensor([[5, 6, 7, 8], [9, 5, PAD, PAD], [1, 2, 3, PAD]])
    negatives = torch.tensor([100, 6, 101])
    batch = make_batch(windows, negatives)
    features = batch.features.to_dict()
    candidates = features[CANDIDATES].values()
    assert candidates.tolist() == sorted(set(candidates.tolist()))  # unique
    assert set(candidates.tolist()) == {6, 7, 8, 5, 2, 3, 100, 101}  # targets and negatives, nothing else
    history = features[HISTORY]
    assert history.lengths().tolist() == [3, 1, 2]
    assert history.values().tolist() == [5, 6, 7, 9, 1, 2]
    for b, row in enumerate(windows.tolist()):
        for t in range(len(row) - 1):
            if row[t + 1] == PAD:
                assert batch.labels[b, t] == IGNORE
            else:
                assert candidates[batch.labels[b, t]] == row[t + 1]


def test_train_batches_split_each_epoch_across_ranks():
    windows = torch.arange(23)[:, None].repeat(1, 3)  # row r is identified by its value r
    catalogue = torch.arange(1000, 1010)
    loaders = [TrainBatches(windows, catalogue, 4, 2, rank, 3, seed=7) for rank in range(3)]
    assert loaders[0].steps_per_epoch == math.ceil(23 / 12)
    for epoch in range(2):
        per_rank = [list(loader.epoch(epoch)) for loader in loaders]
        assert all(len(batches) == loaders[0].steps_per_epoch for batches in per_rank)
        rows = [int(v) for batches in per_rank for b in batches for v in b.features[HISTORY].values()[::2]]
        assert set(rows) == set(range(23))  # every window, padding the last global batch by wrapping around
        assert len(rows) == 3 * 4 * loaders[0].steps_per_epoch
    again = [b.labels for b in TrainBatches(windows, catalogue, 4, 2, 1, 3, seed=7).epoch(1)]
    assert all(torch.equal(a, b.labels) for a, b in zip(again, loaders[1].epoch(1)))  # deterministic


def reference_sums(scores, target, exclude, k):
    hits = ndcg = 0.0
    for row, t, ex in zip(scores.tolist(), target.tolist(), exclude.tolist()):
        rank = sum(1 for i, s in enumerate(row) if i != t and not ex[i] and s > row[t])
        if rank < k:
            hits, ndcg = hits + 1, ndcg + 1 / math.log2(rank + 2)
    return [hits, ndcg, float(len(target))]


@settings(deadline=None, max_examples=40)
@given(seed=st.integers(0, 10_000), users=st.integers(1, 5), items=st.integers(1, 12), k=st.integers(1, 5))
def test_ranking_sums_match_reference(seed, users, items, k):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 4, (users, items), generator=g).double()  # many ties
    target = torch.randint(0, items, (users,), generator=g)
    exclude = torch.rand(users, items, generator=g) < 0.3
    got = ranking_sums(scores, target, exclude, k)
    torch.testing.assert_close(got, torch.tensor(reference_sums(scores, target, exclude, k), dtype=torch.float64))


def test_training_item_mask():
    split = sequences([2, 3])  # user 0: items 1, 2; user 1: items 3, 4, 5
    catalogue = torch.tensor([1, 2, 3, 4, 5, 9])
    mask = training_item_mask(split, torch.tensor([1, 0]), catalogue)
    assert mask.tolist() == [[False, False, True, True, True, False], [True, True, False, False, False, False]]


@settings(deadline=None, max_examples=50)
@given(users=st.integers(2, 60), world=st.integers(1, 4), batch=st.integers(1, 9))
def test_eval_users_same_number_of_calls_on_every_rank(users, world, batch):
    assume(users // world >= math.ceil(math.ceil(users / world) / batch))  # enough users for non-empty chunks
    chunks = [my_users(users, rank, world, batch) for rank in range(world)]
    assert len({len(c) for c in chunks}) == 1
    assert all(0 < part.numel() <= batch for c in chunks for part in c)
    assert sorted(torch.cat([p for c in chunks for p in c]).tolist()) == list(range(users))

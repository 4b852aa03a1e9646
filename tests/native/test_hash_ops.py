"""hash_unique, hash_rank, hash_bucketize and hash_uniform_init against their plain-Python references."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.native import ops, reference

MIN_ID, MAX_ID = -(2**63), 2**63 - 1

# Small pools make duplicates likely; the full int64 range checks the 64-bit arithmetic.
ID_LISTS = st.lists(st.one_of(st.integers(0, 20), st.integers(MIN_ID, MAX_ID)), max_size=60)
PROPERTY = settings(max_examples=60, deadline=None)


def as_ids(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def assert_same(got, expected) -> None:
    """Tensors (or None), or tuples of them, equal in dtype, shape and values (bitwise for floats)."""
    if isinstance(expected, tuple):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same(g, e)
        return
    if expected is None:
        assert got is None
        return
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got, expected), f"{got} != {expected}"


# ---- mix64 / hash_rank


def test_mix64_reference_pins_known_values():
    # splitmix64's published finaliser: outputs of the generator seeded with 0 are mix64(k * golden), k = 1, 2
    assert reference.mix64(reference.GOLDEN) == 0xE220A8397B1DCDAF
    assert reference.mix64(2 * reference.GOLDEN) == 0x6E789E6AA1B965F4
    assert reference.mix64(0) == 0


@PROPERTY
@given(values=ID_LISTS, world_size=st.integers(1, 70))
def test_hash_rank_matches_reference(values, world_size):
    ranks = ops.hash_rank(as_ids(values), world_size)
    assert_same(ranks, reference.hash_rank(as_ids(values), world_size))


def test_hash_rank_spreads_sequential_ids_evenly():
    counts = torch.bincount(ops.hash_rank(torch.arange(80_000), 8), minlength=8)
    assert counts.min() > 9_500 and counts.max() < 10_500  # 10,000 each +- 5 %; the data is fixed


def test_hash_rank_rejects_bad_world_size():
    with pytest.raises(ValueError, match="world_size` must be >= 1, got 0"):
        ops.hash_rank(as_ids([1]), 0)


# ---- hash_unique


@pytest.mark.parametrize(
    "values",
    [[], [5], [7, 7, 7], [3, 1, 3, 2, 1, 3], [MAX_ID, MIN_ID, -1, 0, -1, MAX_ID], list(range(100, 0, -1))],
)
def test_hash_unique_edge_cases(values):
    assert_same(ops.hash_unique(as_ids(values)), reference.hash_unique(as_ids(values)))


@PROPERTY
@given(values=ID_LISTS)
def test_hash_unique_matches_reference(values):
    unique, inverse, counts = ops.hash_unique(as_ids(values))
    assert_same((unique, inverse, counts), reference.hash_unique(as_ids(values)))


def test_hash_unique_large_batch_invariants():
    """Beyond the reference's reach: unique[inverse] == ids, counts sum to n, same set as torch.unique."""
    ids = torch.randint(0, 50_000, (200_000,), generator=torch.Generator().manual_seed(0)) * 1_000_003
    unique, inverse, counts = ops.hash_unique(ids)
    assert torch.equal(unique[inverse], ids)
    assert int(counts.sum()) == ids.numel()
    assert torch.equal(torch.sort(unique).values, torch.unique(ids))
    positions = torch.arange(ids.numel())
    first_seen = torch.full((unique.numel(),), ids.numel()).scatter_reduce(0, inverse, positions, "amin")
    assert bool((first_seen[1:] > first_seen[:-1]).all())  # first-occurrence order


# ---- hash_bucketize


@st.composite
def jagged_batches(draw):
    lengths = draw(st.lists(st.integers(0, 6), max_size=12))
    values = draw(st.lists(st.one_of(st.integers(0, 30), st.integers(0, MAX_ID)), min_size=sum(lengths),
                           max_size=sum(lengths)))
    dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    weighted = draw(st.booleans())
    weights = torch.arange(len(values), dtype=torch.float32) / 7 if weighted else None
    return torch.tensor(lengths, dtype=dtype), as_ids(values), weights, draw(st.integers(1, 5))


@PROPERTY
@given(batch=jagged_batches())
def test_hash_bucketize_matches_reference_and_invariants(batch):
    lengths, values, weights, world_size = batch
    got = ops.hash_bucketize(lengths, values, weights, world_size)
    assert_same(got, reference.hash_bucketize(lengths, values, weights, world_size))
    new_lengths, new_values, new_weights, permute = got
    assert torch.equal(new_values[permute], values)
    if weights is not None:
        assert torch.equal(new_weights[permute], weights)
    per_rank = new_lengths.view(world_size, -1).sum(dim=1)
    bucket_of_position = torch.repeat_interleave(torch.arange(world_size), per_rank)
    assert torch.equal(bucket_of_position, ops.hash_rank(new_values, world_size))


def test_hash_bucketize_empty_and_all_empty_segments():
    for lengths in ([], [0, 0, 0]):
        got = ops.hash_bucketize(torch.tensor(lengths, dtype=torch.int32), as_ids([]), None, 3)
        assert_same(got, reference.hash_bucketize(torch.tensor(lengths, dtype=torch.int32), as_ids([]), None, 3))


def fbgemm_bucketize(lengths, values, weights, world_size, block_size):
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)

    num_features = lengths.numel()  # one segment per "feature" with batch size 1
    new_lengths, new_values, new_weights, _, permute = torch.ops.fbgemm.block_bucketize_sparse_features(
        lengths, values, bucketize_pos=False, sequence=True,
        block_sizes=torch.full((num_features,), block_size, dtype=values.dtype), my_size=world_size,
        weights=weights, keep_orig_idx=True,
    )
    return new_lengths, new_values, new_weights, permute


def test_hash_bucketize_layout_equals_fbgemm_with_one_bucket():
    lengths = torch.tensor([2, 0, 3, 1, 4], dtype=torch.int64)
    values = as_ids([9, 4, 2**40, 7, 7, 0, 3, 3, 8, 1])
    weights = torch.rand(values.numel())
    expected = fbgemm_bucketize(lengths, values, weights, world_size=1, block_size=2**62)
    assert_same(ops.hash_bucketize(lengths, values, weights, 1), expected)


def test_hash_bucketize_layout_equals_fbgemm_when_blocks_coincide_with_hash_ranks():
    """IDs chosen so that id // block_size == hash_rank(id): both ops must then place every value alike."""
    world_size, block_size = 4, 1000
    candidates = torch.randperm(world_size * block_size, generator=torch.Generator().manual_seed(1))
    chosen = candidates[candidates // block_size == ops.hash_rank(candidates, world_size)][:60]
    lengths = torch.tensor([5, 0, 12, 7, 1, 15, 20], dtype=torch.int32)
    values = chosen[: int(lengths.sum())]
    weights = torch.arange(values.numel(), dtype=torch.float32)
    expected = fbgemm_bucketize(lengths, values, weights, world_size, block_size)
    assert_same(ops.hash_bucketize(lengths, values, weights, world_size), expected)


@pytest.mark.parametrize(
    "lengths, values, weights, error, message",
    [
        (torch.tensor([2, 2]), as_ids([1, 2, 3]), None, ValueError, "sum to 4 but there are 3 values"),
        (torch.tensor([-1, 2]), as_ids([1]), None, ValueError, "non-negative, got -1 at position 0"),
        (torch.tensor([1]), as_ids([1]), torch.ones(2), ValueError, "one weight per value"),
        (torch.tensor([1.0]), as_ids([1]), None, TypeError, "`lengths` must be int32 or int64"),
        (torch.tensor([1]), torch.tensor([1], dtype=torch.int32), None, TypeError, "`values` must be int64"),
    ],
)
def test_hash_bucketize_rejects_bad_input(lengths, values, weights, error, message):
    with pytest.raises(error, match=message):
        ops.hash_bucketize(lengths, values, weights, 2)


# ---- hash_uniform_init


@PROPERTY
@given(
    values=st.lists(st.integers(MIN_ID, MAX_ID), max_size=8),
    seed=st.integers(MIN_ID, MAX_ID),
    dim=st.integers(0, 9),
    bounds=st.sampled_from([(-1.0, 1.0), (0.0, 1.0), (-0.01, 0.01), (0.1, 0.3), (-1.5e38, 1.5e38), (5.0, 5.000001)]),
)
def test_hash_uniform_init_matches_reference_bitwise(values, seed, dim, bounds):
    low, high = bounds
    rows = ops.hash_uniform_init(as_ids(values), seed, dim, low, high)
    assert_same(rows, reference.hash_uniform_init(as_ids(values), seed, dim, low, high))
    assert bool(((rows >= torch.tensor(low, dtype=torch.float32)) & (rows.double() < high)).all())


def test_hash_uniform_init_rounding_never_reaches_high():
    # Every value in [1, 1 + 2**-23) rounds to 1.0 or to high itself; the result must stay below high.
    high = 1.0 + 2.0**-23
    rows = ops.hash_uniform_init(torch.arange(64), 0, 16, 1.0, high)
    assert bool((rows == 1.0).all())
    assert_same(rows, reference.hash_uniform_init(torch.arange(64), 0, 16, 1.0, high))


def test_hash_uniform_init_rows_depend_only_on_seed_and_id():
    ids = torch.arange(1000) * 7_777_777_777
    rows = ops.hash_uniform_init(ids, 42, 16, -0.5, 0.5)
    order = torch.randperm(1000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ops.hash_uniform_init(ids[order], 42, 16, -0.5, 0.5), rows[order])  # arrival order
    assert torch.equal(ops.hash_uniform_init(ids[:10], 42, 16, -0.5, 0.5), rows[:10])  # batch composition
    assert torch.equal(ops.hash_uniform_init(ids, 42, 4, -0.5, 0.5), rows[:, :4])  # column j ignores dim
    assert not torch.equal(ops.hash_uniform_init(ids, 43, 16, -0.5, 0.5), rows)  # the seed matters
    assert abs(float(rows.mean())) < 0.01 and float(rows.min()) < -0.49 and float(rows.max()) > 0.49


@pytest.mark.parametrize(
    "dim, low, high, message",
    [(-1, 0.0, 1.0, "`dim` must be >= 0"), (4, 1.0, 1.0, "low < high"), (4, 0.0, float("inf"), "finite")],
)
def test_hash_uniform_init_rejects_bad_arguments(dim, low, high, message):
    with pytest.raises(ValueError, match=message):
        ops.hash_uniform_init(as_ids([1]), 0, dim, low, high)

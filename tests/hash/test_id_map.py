"""IdMap (native) against IdMapReference (a dict): edge cases, a stateful model test, checkpoints and rebuilds."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.hash.id_map import IdMap, num_buckets_for
from torchrec_ascend.native import ops
from torchrec_ascend.native.reference import IdMapReference

MAX_ID = 2**63 - 1


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def assert_same(got, expected) -> None:
    """Tensors, or tuples of them, equal in dtype, shape and values."""
    if isinstance(expected, tuple):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same(g, e)
        return
    assert got.dtype == expected.dtype
    assert torch.equal(got, expected), f"{got} != {expected}"


def apply_both(id_map: IdMap, ref: IdMapReference, method: str, batch: torch.Tensor) -> None:
    assert_same(getattr(id_map, method)(batch), getattr(ref, method)(batch))
    assert len(id_map) == len(ref)


# ---- edge cases against the reference


def test_empty_inputs_and_empty_map():
    id_map, ref = IdMap(4), IdMapReference(4)
    for method in ("insert_or_lookup", "lookup", "remove"):
        apply_both(id_map, ref, method, ids())
    assert_same(id_map.export(), ref.export())
    assert len(id_map) == 0


def test_duplicates_in_one_call_get_one_slot_and_one_is_new():
    id_map, ref = IdMap(8), IdMapReference(8)
    apply_both(id_map, ref, "insert_or_lookup", ids(9, 4, 9, 9, 4, 1))
    slots, is_new = id_map.insert_or_lookup(ids(1, 9, 5))
    assert slots.tolist() == [2, 0, 3] and is_new.tolist() == [False, False, True]


def test_full_map_returns_minus_one_and_inserts_nothing():
    id_map, ref = IdMap(3), IdMapReference(3)
    apply_both(id_map, ref, "insert_or_lookup", ids(10, 11, 12, 13, 10, 13))
    slots, is_new = id_map.insert_or_lookup(ids(13, 12))
    assert slots.tolist() == [-1, 2] and is_new.tolist() == [False, False]
    assert id_map.lookup(ids(13)).tolist() == [-1]  # not silently inserted
    apply_both(id_map, ref, "remove", ids(11))
    apply_both(id_map, ref, "insert_or_lookup", ids(13, 14))  # 13 takes the freed slot, 14 finds none


def test_freed_slots_are_reused_most_recent_first_before_fresh_ones():
    id_map, ref = IdMap(10), IdMapReference(10)
    apply_both(id_map, ref, "insert_or_lookup", ids(0, 1, 2, 3, 4))
    apply_both(id_map, ref, "remove", ids(1, 3, 3, 77))  # second 3 and 77 are absent
    slots, _ = id_map.insert_or_lookup(ids(50, 51, 52))
    assert slots.tolist() == [3, 1, 5]
    ref.insert_or_lookup(ids(50, 51, 52))
    assert_same(id_map.export(), ref.export())


def test_extreme_ids_and_capacity_one():
    id_map, ref = IdMap(1), IdMapReference(1)
    apply_both(id_map, ref, "insert_or_lookup", ids(MAX_ID, 0, MAX_ID))
    apply_both(id_map, ref, "lookup", ids(0, MAX_ID))
    apply_both(id_map, ref, "remove", ids(MAX_ID))
    apply_both(id_map, ref, "insert_or_lookup", ids(0))
    assert_same(id_map.export(), ref.export())


def test_churn_at_full_load_matches_reference():
    """High load factor and many removals: long clusters, wrap-around probes and backward shifts."""
    rng = random.Random(7)
    capacity = 3000  # 4096 buckets: 73 % load when full
    id_map, ref = IdMap(capacity), IdMapReference(capacity)
    pool = [rng.randrange(MAX_ID) for _ in range(4000)]
    for _ in range(40):
        apply_both(id_map, ref, "insert_or_lookup", torch.tensor(rng.choices(pool, k=500)))
        apply_both(id_map, ref, "remove", torch.tensor(rng.choices(pool, k=300)))
        apply_both(id_map, ref, "lookup", torch.tensor(pool))
    assert_same(id_map.export(), ref.export())


def test_slots_do_not_depend_on_bucket_layout():
    """Slot assignment depends on the call sequence only, so maps of different sizes agree until one is full."""
    rng = random.Random(3)
    small, large = IdMap(700), IdMap(5000)  # 10 batches of 60 never fill the small one
    assert num_buckets_for(700) != num_buckets_for(5000)
    for _ in range(10):
        batch = torch.tensor([rng.randrange(2000) for _ in range(60)])
        assert_same(small.insert_or_lookup(batch), large.insert_or_lookup(batch))
        removed = torch.tensor([rng.randrange(2000) for _ in range(30)])
        assert_same(small.remove(removed), large.remove(removed))


def test_same_calls_give_identical_states():
    """Column-wise shards of one table see the same calls and must hold bit-identical state."""
    a, b = IdMap(64), IdMap(64)
    for m in (a, b):
        m.insert_or_lookup(torch.arange(50) * 7919)
        m.remove(torch.arange(0, 50, 3) * 7919)
        m.insert_or_lookup(torch.arange(40, 60) * 7919)
    for key, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[key]), key


# ---- checkpoints and rebuilds


def test_state_dict_round_trip_preserves_future_behaviour():
    src = IdMap(32)
    src.insert_or_lookup(torch.arange(20) * 13)
    src.remove(ids(13, 52, 0))
    dst = IdMap(32)
    dst.load_state_dict(src.state_dict())
    assert len(dst) == len(src) == 17
    assert_same(dst.export(), src.export())
    batch = ids(1000, 13, 26, 2000, 0, 3000)
    assert_same(dst.insert_or_lookup(batch), src.insert_or_lookup(batch))
    assert set(src.state_dict()) == {"buckets", "free_slots", "counters"}


def test_from_export_matches_reference_rebuild_and_continues_identically():
    src, ref = IdMap(16), IdMapReference(16)
    for method, batch in [("insert_or_lookup", torch.arange(12) + 100), ("remove", ids(101, 105, 104, 111))]:
        apply_both(src, ref, method, batch)
    exported = src.export()
    assert exported[1].tolist() == [0, 2, 3, 6, 7, 8, 9, 10]  # sorted by slot, holes where removed
    rebuilt, rebuilt_ref = IdMap.from_export(*exported, capacity=40), IdMapReference.from_export(*exported, 40)
    assert_same(rebuilt.export(), exported)
    # free slots are 1, 4, 5 (lowest first), then fresh 11, 12, ... and the capacity grew
    apply_both(rebuilt, rebuilt_ref, "insert_or_lookup", torch.arange(200, 220))
    assert rebuilt.lookup(ids(200, 201, 202, 203)).tolist() == [1, 4, 5, 11]


@pytest.mark.parametrize(
    "bad_ids, bad_slots, message",
    [
        (ids(1, 2), ids(0, 0), "slot 0 appears twice"),
        (ids(1, 1), ids(0, 1), "ID 1 appears twice"),
        (ids(1, 2), ids(0, 8), "outside \\[0, capacity=8\\)"),
        (ids(1), ids(0, 1), "same length"),
        (ids(1, -4), ids(0, 1), "negative IDs are not allowed.*-4"),
    ],
)
def test_from_export_rejects_bad_exports(bad_ids, bad_slots, message):
    with pytest.raises(ValueError, match=message):
        IdMap.from_export(bad_ids, bad_slots, capacity=8)


def test_failed_rebuild_leaves_a_valid_map():
    id_map = IdMap(8)
    id_map.insert_or_lookup(ids(5, 6))
    with pytest.raises(ValueError, match="slot 9"):  # caught before any change
        ops.id_map_rebuild(id_map.buckets, id_map.free_slots, id_map.counters, ids(1), ids(9))
    assert id_map.export()[0].tolist() == [5, 6]
    with pytest.raises(ValueError, match="appears twice"):  # found while inserting: the map is left empty
        ops.id_map_rebuild(id_map.buckets, id_map.free_slots, id_map.counters, ids(1, 1), ids(0, 1))
    assert len(id_map) == 0 and id_map.lookup(ids(1, 5)).tolist() == [-1, -1]
    assert id_map.insert_or_lookup(ids(3))[0].tolist() == [0]


# ---- input errors


@pytest.mark.parametrize("method", ["insert_or_lookup", "lookup", "remove"])
def test_negative_ids_raise_value_error_naming_the_first(method):
    id_map = IdMap(8)
    with pytest.raises(ValueError, match=r"negative IDs are not allowed.* got -3 at position 1"):
        getattr(id_map, method)(ids(4, -3, -9))
    assert len(id_map) == 0  # checked before any change


@pytest.mark.parametrize(
    "batch, error, message",
    [
        (torch.tensor([1.0, 2.0]), TypeError, "must be int64, got Float"),
        (torch.tensor([1, 2], dtype=torch.int32), TypeError, "must be int64, got Int"),
        (torch.zeros(2, 2, dtype=torch.int64), ValueError, "must be a 1-D tensor"),
    ],
)
def test_malformed_ids_are_rejected(batch, error, message):
    with pytest.raises(error, match=message):
        IdMap(4).insert_or_lookup(batch)


def test_non_contiguous_ids_are_accepted():
    id_map, ref = IdMap(8), IdMapReference(8)
    apply_both(id_map, ref, "insert_or_lookup", torch.arange(20)[::3])


@pytest.mark.parametrize(
    "last_used, step, error, message",
    [
        (torch.zeros(5, dtype=torch.int64), 1, RuntimeError, r"`last_used` must be .* of shape \[capacity=4\]"),
        (torch.zeros(4, dtype=torch.int32), 1, RuntimeError, "`last_used` must be a contiguous int64"),
        (torch.zeros(4, dtype=torch.int64), -1, ValueError, "`step` must be >= 0, got -1"),
    ],
)
def test_insert_stamped_rejects_bad_arguments_and_changes_nothing(last_used, step, error, message):
    id_map = IdMap(4)
    with pytest.raises(error, match=message):
        id_map.insert_stamped(ids(3, 4), last_used, step)
    assert len(id_map) == 0 and not last_used.any()


@pytest.mark.parametrize("capacity", [0, -1, 2.5, True, "8"])
def test_bad_capacity_raises_config_error(capacity):
    with pytest.raises(ConfigError, match="capacity must be a positive int"):
        IdMap(capacity)


def test_corrupted_counters_are_reported():
    id_map = IdMap(4)
    id_map.counters.copy_(ids(5, 0))
    with pytest.raises(RuntimeError, match="state is corrupted"):
        id_map.insert_or_lookup(ids(1))


@pytest.mark.parametrize("capacity", [1, 12, 13, 1000, 10_000_000])
def test_num_buckets_is_a_power_of_two_with_load_at_most_three_quarters(capacity):
    n = num_buckets_for(capacity)
    assert n & (n - 1) == 0 and n >= 16
    assert capacity / n <= 0.75 and (n <= 16 or capacity / (n // 2) > 0.75)


# ---- stateful model test: random call sequences against the dict model

ID_VALUES = st.one_of(st.integers(0, 40), st.integers(0, MAX_ID))
ID_BATCHES = st.lists(ID_VALUES, max_size=30).map(lambda xs: torch.tensor(xs, dtype=torch.int64))


class IdMapMachine(RuleBasedStateMachine):
    @initialize(capacity=st.integers(1, 48))
    def create(self, capacity):
        self.id_map, self.ref = IdMap(capacity), IdMapReference(capacity)
        self.new_last_used(capacity)
        self.step = 0

    def new_last_used(self, capacity):
        """A slot table's last-use steps (what insert_stamped writes) and their plain-Python model."""
        self.last_used = torch.full((capacity,), -7, dtype=torch.int64)
        self.expected_last_used = [-7] * capacity

    @rule(batch=ID_BATCHES)
    def insert_or_lookup(self, batch):
        apply_both(self.id_map, self.ref, "insert_or_lookup", batch)

    @rule(batch=ID_BATCHES, step_gap=st.integers(0, 3))
    def insert_stamped(self, batch, step_gap):
        """The reference's insert_or_lookup, plus: every mapped slot stamped, the inserting positions, the hits."""
        self.step += step_gap
        held_before = set(self.ref.export()[0].tolist())
        slots, is_new = self.ref.insert_or_lookup(batch)
        got_slots, new_positions, hits = self.id_map.insert_stamped(batch, self.last_used, self.step)
        assert_same(got_slots, slots)
        assert_same(new_positions, is_new.nonzero().squeeze(1))
        assert hits == sum(i in held_before for i in batch.tolist())
        for slot in slots.tolist():
            if slot >= 0:
                self.expected_last_used[slot] = self.step
        assert self.last_used.tolist() == self.expected_last_used
        assert len(self.id_map) == len(self.ref)

    @rule(batch=ID_BATCHES)
    def lookup(self, batch):
        apply_both(self.id_map, self.ref, "lookup", batch)

    @rule(batch=ID_BATCHES, data=st.data())
    def remove(self, batch, data):
        held = self.ref.export()[0].tolist()
        if held:  # mostly remove IDs that are present
            present = data.draw(st.lists(st.sampled_from(held), max_size=10))
            batch = torch.cat([batch, torch.tensor(present, dtype=torch.int64)])
        apply_both(self.id_map, self.ref, "remove", batch)

    @precondition(lambda self: len(self.ref) > 0)
    @rule(grow=st.integers(0, 20))
    def rebuild_from_export(self, grow):
        ids_, slots = self.id_map.export()
        capacity = self.ref.capacity + grow
        self.id_map = IdMap.from_export(ids_, slots, capacity)
        self.ref = IdMapReference.from_export(ids_, slots, capacity)
        self.new_last_used(capacity)

    @rule()
    def reload_state_dict(self):
        clone = IdMap(self.id_map.capacity)
        clone.load_state_dict(self.id_map.state_dict())
        self.id_map = clone

    @invariant()
    def same_contents(self):
        assert_same(self.id_map.export(), self.ref.export())


TestIdMapMachine = IdMapMachine.TestCase
TestIdMapMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)

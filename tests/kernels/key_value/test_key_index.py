"""KeyIndex (growable key -> slot map, native ops) against a dict model; its memory per key and its byte bound."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.errors import CapacityError
from torchrec_ascend.kernels.key_value.key_index import HOST_LOW_LOAD, HOST_MAX_LOAD, KeyIndex
from torchrec_ascend.native import ops as native

KEYS = st.lists(st.sampled_from([0, 1, 2, 3, 17, 2**31, 2**40 + 5, 2**63 - 1]), max_size=6)


@settings(deadline=None, max_examples=40)
@given(st.lists(st.tuples(st.booleans(), KEYS), max_size=12), st.integers(0, 3))
def test_matches_dict_model_and_slots_survive_growth(ops, initial_capacity):
    index, model = KeyIndex(initial_capacity), {}
    for is_insert, keys in ops:
        if is_insert:
            new = list(dict.fromkeys(k for k in keys if k not in model))
            slots = index.insert(torch.tensor(new, dtype=torch.int64))
            model.update(zip(new, slots.tolist()))
        else:
            freed = index.remove(torch.tensor(keys, dtype=torch.int64))
            expected = {model.pop(k) for k in dict.fromkeys(keys) if k in model}
            assert sorted(freed.tolist()) == sorted(expected)
        assert len(index) == len(model)
        assert len(set(model.values())) == len(model)  # slots are distinct ...
        assert all(0 <= s < index.capacity for s in model.values())  # ... and addressable
        probe = torch.tensor(list(model) + [5], dtype=torch.int64)
        assert index.lookup(probe).tolist() == list(model.values()) + [-1]  # old slots kept across rebuilds
        if model:
            assert index.keys_of(torch.tensor(list(model.values()))).tolist() == list(model)
        keys, slots = index.export()
        assert dict(zip(keys.tolist(), slots.tolist())) == model


def test_max_capacity_is_a_hard_limit():
    index = KeyIndex(initial_capacity=1, max_capacity=3)
    index.insert(torch.tensor([1, 2, 3]))
    assert index.capacity == 3
    with pytest.raises(CapacityError, match="max_capacity=3"):
        index.insert(torch.tensor([4]))
    assert len(index) == 3


def test_zero_capacity_index_is_empty():
    index = KeyIndex(initial_capacity=4, max_capacity=0)
    assert index.lookup(torch.tensor([1])).tolist() == [-1]
    assert index.remove(torch.tensor([1])).numel() == 0
    assert index.nbytes == 0
    with pytest.raises(CapacityError):
        index.insert(torch.tensor([1]))


@pytest.mark.parametrize("capacity", [1, 5, 1000, 4097, 300_000])
def test_memory_per_key_stays_within_its_bound_while_growing(capacity):
    g = torch.Generator().manual_seed(capacity)
    keys = torch.randint(0, 2**63 - 1, (capacity,), generator=g, dtype=torch.int64).unique()
    index = KeyIndex(max_capacity=capacity)
    for part in keys.split(max(1, capacity // 7)):  # growth happens a partition at a time along the way
        index.insert(part)
        assert index.nbytes <= KeyIndex.nbytes_for(capacity)
    loads = index._table.live / np.maximum(index._table.size, 1)
    assert loads.max() <= HOST_MAX_LOAD
    if capacity >= 1000:  # the fixed cost of empty partitions no longer matters: 12 + 4 / load bytes a key
        assert index.nbytes / keys.numel() <= 12 + 4 / HOST_LOW_LOAD + 0.5
    assert torch.equal(index.lookup(keys), torch.arange(keys.numel()))


def test_bulk_remove_keeps_every_other_key():
    # Thousands of random 63-bit keys: long probe chains in the IdMap, which small property examples rarely build.
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 2**63 - 1, (3000,), generator=g, dtype=torch.int64).unique()
    index = KeyIndex(initial_capacity=16)
    slots = torch.cat([index.insert(part) for part in keys.split(1000)])  # grows twice on the way
    freed = index.remove(keys[:1024])
    assert sorted(freed.tolist()) == sorted(slots[:1024].tolist())
    assert (index.lookup(keys[:1024]) == -1).all()
    assert torch.equal(index.lookup(keys[1024:]), slots[1024:])
    assert len(index) == keys.numel() - 1024


def check_table_invariants(index):
    table = index._table
    assert (table.live <= table.used).all() and (table.used <= HOST_MAX_LOAD * table.size).all()
    live, tombs = 0, 0
    for p in range(table.partitions):
        region = table.buckets[p * table.stride : p * table.stride + table.size[p]]
        assert (table.buckets[p * table.stride + table.size[p] : (p + 1) * table.stride] == 0).all()
        live += int(((region != 0) & (region != table.tomb)).sum())
        tombs += int((region == table.tomb).sum())
    assert live == len(index) and tombs == int((table.used - table.live).sum())


BATCHES = st.lists(st.integers(0, 2**63 - 1) | st.integers(0, 400), max_size=300)


@settings(deadline=None, max_examples=30)
@given(st.lists(st.tuples(st.sampled_from(["insert", "remove", "lookup"]), BATCHES), max_size=25))
def test_native_index_matches_dict_model_through_growth_and_tombstones(ops):
    # max_capacity 20000: 4 partitions, each growing from 8 buckets and rebuilt as tombstones pile up.
    index, model, freed_stack = KeyIndex(max_capacity=20_000), {}, []
    for op, keys in ops:
        batch = torch.tensor(keys, dtype=torch.int64)
        if op == "insert":
            new = list(dict.fromkeys(k for k in keys if k not in model))
            slots = index.insert(torch.tensor(new, dtype=torch.int64)).tolist()
            reused = min(len(new), len(freed_stack))
            expected = [freed_stack.pop() for _ in range(reused)]  # the most recently freed slot first
            assert slots[:reused] == expected
            model.update(zip(new, slots))
        elif op == "remove":
            freed = index.remove(batch).tolist()
            assert freed == [model.pop(k) for k in dict.fromkeys(keys) if k in model]  # order of first occurrence
            freed_stack.extend(freed)
        assert index.lookup(batch).tolist() == [model.get(k, -1) for k in keys]
        assert len(index) == len(model)
        check_table_invariants(index)
    keys, slots = index.export()
    assert dict(zip(keys.tolist(), slots.tolist())) == model


@pytest.mark.parametrize("batch", [[7, 8, 7], [8, 1]])
def test_insert_of_a_repeated_or_present_key_changes_nothing(batch):
    index = KeyIndex(max_capacity=100)
    index.insert(torch.tensor([1, 2, 3]))
    index.remove(torch.tensor([2]))
    with pytest.raises(ValueError, match="present or repeats"):
        index.insert(torch.tensor(batch))
    assert (len(index), index.capacity) == (2, 3)
    assert index.lookup(torch.tensor([1, 2, 3, 7, 8])).tolist() == [0, -1, 2, -1, -1]
    assert index.insert(torch.tensor([9, 10])).tolist() == [1, 3]  # the freed slot 1 is still handed out first
    check_table_invariants(index)


def test_rebuild_for_fewer_keys_shrinks_partitions_and_clears_what_they_left():
    g = torch.Generator().manual_seed(1)
    keys = torch.randint(0, 2**63 - 1, (200_000,), generator=g, dtype=torch.int64).unique()
    index = KeyIndex(max_capacity=keys.numel())  # 32 partitions
    index.insert(keys)
    big = index._table.size.copy()
    index.remove(keys[1000:])
    index.insert(torch.tensor([-5]))  # no partition is due for a rebuild yet: tombstones count as used
    for _ in range(3):  # churn until every partition passed HOST_MAX_LOAD once and was rebuilt for its few keys
        batch = torch.randint(0, 2**63 - 1, (60_000,), generator=g, dtype=torch.int64).unique()
        batch = batch[index.lookup(batch) < 0]
        index.insert(batch)
        index.remove(batch)
    assert (index._table.size < big).all()
    check_table_invariants(index)
    assert torch.equal(index.lookup(keys[:1000]), torch.arange(1000))


FREE = 2**31 - 1  # the host store's stamp of a freed slot


@settings(deadline=None, max_examples=30)
@given(st.lists(st.tuples(st.sampled_from(["upsert", "pop", "remove"]), BATCHES), max_size=25))
def test_upsert_and_pop_match_a_dict_model_with_stamps(ops):
    # The host store's one-pass put and pop: slots of present keys kept, new keys given the most recently freed slot
    # first (then fresh ones), the last occurrence of a repeated key named, every slot touched stamped.
    index, model, stamped, freed_stack = KeyIndex(max_capacity=20_000), {}, {}, []
    stamps = torch.zeros(20_000, dtype=torch.int32)
    for clock, (op, keys) in enumerate(ops, start=1):
        batch = torch.tensor(keys, dtype=torch.int64)
        distinct = list(dict.fromkeys(keys))
        if op == "upsert":
            fresh = index.capacity
            slots, positions = index.upsert(batch, stamps, clock)
            for k in distinct:
                if k not in model:
                    model[k] = freed_stack.pop() if freed_stack else fresh
                    fresh += model[k] == fresh
                stamped[model[k]] = clock
            assert slots.tolist() == [model[k] for k in distinct]
            assert positions.tolist() == [len(keys) - 1 - keys[::-1].index(k) for k in distinct]
            assert index.capacity == fresh
        else:
            expected = [model.get(k, -1) for k in keys]
            if op == "pop":
                assert index.pop(batch, stamps, FREE).tolist() == expected
            freed = [model.pop(k) for k in distinct if k in model]
            if op == "remove":
                assert index.remove(batch).tolist() == freed  # order of first occurrence
            freed_stack.extend(freed)
            stamped.update(dict.fromkeys(freed, FREE) if op == "pop" else {})
        assert index.lookup(batch).tolist() == [model.get(k, -1) for k in keys]
        assert {s: int(stamps[s]) for s in stamped} == stamped
        assert len(index) == len(model)
        check_table_invariants(index)
    keys, slots = index.export()
    assert dict(zip(keys.tolist(), slots.tolist())) == model


def test_upsert_of_more_keys_than_fit_changes_nothing():
    index, stamps = KeyIndex(max_capacity=3), torch.zeros(3, dtype=torch.int32)
    index.upsert(torch.tensor([1, 2]), stamps, 1)
    with pytest.raises(CapacityError, match="max_capacity=3"):
        index.upsert(torch.tensor([2, 3, 4]), stamps, 2)  # one key is present, but the bound is per key given
    assert (len(index), index.capacity, stamps.tolist()) == (2, 2, [1, 1, 0])


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("stamps", torch.zeros(0, dtype=torch.int32), "must not be empty"),
        ("stamps", torch.zeros(64, dtype=torch.int64), "int32 tensor of at least 64"),
        ("counts", torch.tensor([5, 2, 5]), "corrupted"),
        ("stamp", -1, "stamp must be in"),
    ],
)
def test_native_upsert_refuses_bad_slot_state_and_changes_nothing(field, value, message):
    index = KeyIndex(max_capacity=64)
    index.insert(torch.tensor([10, 20]))
    args = {"stamps": torch.zeros(64, dtype=torch.int32), "counts": index._slot_state[1], "stamp": 3}
    args[field] = value
    before = [t.clone() for t in index._table.state]
    with pytest.raises((ValueError, RuntimeError), match=message):
        native.key_index_upsert(*index._table.state, index._key_column, index._slot_state[0], args["counts"],
                                args["stamps"], torch.tensor([30, 10]), args["stamp"], HOST_MAX_LOAD, HOST_LOW_LOAD)
    assert all(torch.equal(a, b) for a, b in zip(before, index._table.state))
    assert index.lookup(torch.tensor([10, 20, 30])).tolist() == [0, 1, -1]


def test_upsert_of_present_keys_rebuilds_nothing():
    # Partitions are rebuilt for the keys a put adds, not for the keys it overwrites: a full index stays its size.
    g = torch.Generator().manual_seed(2)
    keys = torch.randint(0, 2**63 - 1, (20_000,), generator=g, dtype=torch.int64).unique()
    index = KeyIndex(max_capacity=2 * keys.numel())  # upsert's bound counts every key given as new
    stamps = torch.zeros(2 * keys.numel(), dtype=torch.int32)
    index.upsert(keys, stamps, 1)
    sizes, nbytes = index._table.size.copy(), index.nbytes
    for clock, part in enumerate([keys, *keys.split(5000)], start=2):  # all of them again: twice each partition
        slots, positions = index.upsert(part, stamps, clock)
        assert torch.equal(positions, torch.arange(part.numel()))
    assert np.array_equal(index._table.size, sizes) and index.nbytes == nbytes
    check_table_invariants(index)

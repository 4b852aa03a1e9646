"""Registration of torch.ops.torchrec_ascend: pinned schemas, torch.library.opcheck, meta and fake-tensor shapes."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from torchrec_ascend.hash.id_map import IdMap
from torchrec_ascend.kernels.key_value.key_index import (
    DISK_LOW_LOAD,
    HOST_LOW_LOAD,
    HOST_MAX_LOAD,
    MAX_LOAD,
    KeyIndex,
    OpenTable,
)
from torchrec_ascend.native import ops

# Changing one of these breaks checkpoints, compiled graphs or NPU kernels written against it: add a new op instead.
SCHEMAS = {
    "id_map_insert_or_lookup": "torchrec_ascend::id_map_insert_or_lookup(Tensor(a!) buckets, Tensor free_slots, "
    "Tensor(b!) counters, Tensor ids) -> (Tensor slots, Tensor is_new)",
    "id_map_insert_stamped": "torchrec_ascend::id_map_insert_stamped(Tensor(a!) buckets, Tensor free_slots, "
    "Tensor(b!) counters, Tensor(c!) last_used, Tensor ids, int step) -> (Tensor slots, Tensor new_positions, "
    "Tensor hits)",
    "id_map_lookup": "torchrec_ascend::id_map_lookup(Tensor buckets, Tensor ids) -> Tensor",
    "id_map_remove": "torchrec_ascend::id_map_remove(Tensor(a!) buckets, Tensor(b!) free_slots, Tensor(c!) counters, "
    "Tensor ids) -> Tensor",
    "id_map_export": "torchrec_ascend::id_map_export(Tensor buckets, Tensor counters) -> (Tensor ids, Tensor slots)",
    "id_map_rebuild": "torchrec_ascend::id_map_rebuild(Tensor(a!) buckets, Tensor(b!) free_slots, "
    "Tensor(c!) counters, Tensor ids, Tensor slots) -> ()",
    "key_index_lookup": "torchrec_ascend::key_index_lookup(Tensor buckets, Tensor sizes, Tensor key_column, "
    "Tensor keys) -> Tensor",
    "key_index_insert": "torchrec_ascend::key_index_insert(Tensor(a!) buckets, Tensor(b!) sizes, Tensor(c!) live, "
    "Tensor(d!) used, Tensor key_column, Tensor slots, float max_load, float low_load) -> Tensor",
    "key_index_upsert": "torchrec_ascend::key_index_upsert(Tensor(a!) buckets, Tensor(b!) sizes, Tensor(c!) live, "
    "Tensor(d!) used, Tensor(e!) key_column, Tensor free_slots, Tensor(f!) counts, Tensor(g!) stamps, Tensor keys, "
    "int stamp, float max_load, float low_load) -> (Tensor slots, Tensor positions, Tensor full)",
    "key_index_pop": "torchrec_ascend::key_index_pop(Tensor(a!) buckets, Tensor sizes, Tensor(b!) live, "
    "Tensor key_column, Tensor(c!) free_slots, Tensor(d!) counts, Tensor(e!) stamps, Tensor keys, int free_stamp) "
    "-> (Tensor slots, Tensor freed)",
    "fingerprint_find": "torchrec_ascend::fingerprint_find(Tensor buckets, Tensor sizes, Tensor part, "
    "Tensor fingerprints, Tensor after, int fingerprint_bits) -> Tensor",
    "fingerprint_insert": "torchrec_ascend::fingerprint_insert(Tensor(a!) buckets, Tensor(b!) sizes, "
    "Tensor(c!) live, Tensor(d!) used, Tensor part, Tensor entries, int fingerprint_bits, float max_load, "
    "float low_load) -> Tensor",
    "read_records": "torchrec_ascend::read_records(Tensor fds, Tensor offsets, int record_bytes, Tensor(a!) out) "
    "-> Tensor",
    "hash_unique": "torchrec_ascend::hash_unique(Tensor ids) -> (Tensor unique, Tensor inverse, Tensor counts)",
    "hash_rank": "torchrec_ascend::hash_rank(Tensor ids, int world_size) -> Tensor",
    "hash_bucketize": "torchrec_ascend::hash_bucketize(Tensor lengths, Tensor values, Tensor? weights, "
    "int world_size) -> (Tensor new_lengths, Tensor new_values, Tensor? new_weights, Tensor unbucketize_permute)",
    "hash_uniform_init": "torchrec_ascend::hash_uniform_init(Tensor ids, int seed, int dim, float low, float high) "
    "-> Tensor",
    "select_lowest": "torchrec_ascend::select_lowest(Tensor scores, Tensor candidates, int num) -> Tensor",
    "select_lowest_packed": "torchrec_ascend::select_lowest_packed(Tensor high, Tensor low, Tensor candidates, "
    "int num) -> Tensor",
    "take_slots": "torchrec_ascend::take_slots(Tensor(a!) free, Tensor slots) -> Tensor",
}


def test_library_holds_exactly_the_pinned_ops():
    prefix = "torchrec_ascend::"
    registered = {name[len(prefix):] for name in torch._C._dispatch_get_all_op_names() if name.startswith(prefix)}
    assert registered == set(SCHEMAS)
    assert set(ops.__all__) == set(SCHEMAS)  # one documented wrapper per op


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_is_pinned(name):
    assert str(getattr(torch.ops.torchrec_ascend, name).default._schema) == SCHEMAS[name]


def filled_state():
    id_map = IdMap(16)
    id_map.insert_or_lookup(torch.tensor([30, 10, 20, 40]))
    id_map.remove(torch.tensor([10]))
    return id_map.buckets.clone(), id_map.free_slots.clone(), id_map.counters.clone()


def key_index_state():
    """A host-tier key index holding keys 20 and 30 (slots 1, 2) with key 10 removed (slot 0 free): its table state,
    key column and slot state (free stack, counts), cloned."""
    index = KeyIndex(max_capacity=64)
    index.insert(torch.tensor([10, 20, 30]))
    index.remove(torch.tensor([10]))
    return [t.clone() for t in index._table.state], index._key_column.clone(), [t.clone() for t in index._slot_state]


def fingerprint_state():
    """A disk-tier index of two partitions holding three entries: its state tensors."""
    state = [t.clone() for t in OpenTable(np.uint64, 2, 64).state]
    ops.fingerprint_insert(*state, torch.tensor([0, 1, 1]), torch.tensor([5 << 36 | 1, 7 << 36 | 2, 9 << 36 | 3]),
                           28, MAX_LOAD, DISK_LOW_LOAD)
    return state


@pytest.fixture(scope="module")
def records_fd():
    """A descriptor of a 256-byte file, for the read_records case."""
    with tempfile.TemporaryFile() as f:
        f.write(bytes(range(256)))
        f.flush()
        yield f.fileno()


def opcheck_cases(records_fd):
    ids = torch.tensor([20, 5, 20, 7, 30])
    lengths = torch.tensor([2, 0, 3], dtype=torch.int32)
    (buckets, sizes, live, used), key_column, (free_slots, counts) = key_index_state()
    stamps = torch.zeros(64, dtype=torch.int32)
    insert_column = key_column.clone()
    insert_column[3] = 5
    fingerprints = fingerprint_state()
    return {
        "key_index_lookup": (buckets, sizes, key_column, ids),
        "key_index_insert": (buckets, sizes, live, used, insert_column, torch.tensor([3]), HOST_MAX_LOAD,
                             HOST_LOW_LOAD),
        "key_index_upsert": (buckets, sizes, live, used, key_column, free_slots, counts, stamps, ids, 3, HOST_MAX_LOAD,
                             HOST_LOW_LOAD),
        "key_index_pop": (buckets, sizes, live, key_column, free_slots, counts, stamps, ids, 2**31 - 1),
        "fingerprint_find": (fingerprints[0], fingerprints[1], torch.tensor([0, 1, 1]), torch.tensor([5, 9, 4]),
                             torch.tensor([-1, -1, -1]), 28),
        "fingerprint_insert": (*fingerprints, torch.tensor([1]), torch.tensor([11 << 36 | 4]), 28, MAX_LOAD,
                               DISK_LOW_LOAD),
        "id_map_insert_or_lookup": (*filled_state(), ids),
        "id_map_insert_stamped": (*filled_state(), torch.zeros(16, dtype=torch.int64), ids, 3),
        "id_map_lookup": (filled_state()[0], ids),
        "id_map_remove": (*filled_state(), ids),
        "id_map_export": (filled_state()[0], filled_state()[2]),
        "id_map_rebuild": (*filled_state(), torch.tensor([8, 9]), torch.tensor([3, 1])),
        "read_records": (torch.tensor([records_fd] * 3), torch.tensor([7, 0, 7]), 16,
                         torch.empty(3, 2, dtype=torch.int64)),
        "hash_unique": (ids,),
        "hash_rank": (ids, 3),
        "hash_bucketize": (lengths, ids, torch.rand(5), 3),
        "hash_uniform_init": (ids, 7, 4, -1.0, 1.0),
        "select_lowest": (torch.tensor([3.0, -1.0, 2.0, 0.5], dtype=torch.float64),
                          torch.tensor([True, True, False, True]), 2),
        "select_lowest_packed": (torch.tensor([1, 0, -3, 2**40]), torch.tensor([0, 5, 2, 7]),
                                 torch.tensor([True, True, False, True]), 2),
        "take_slots": (torch.tensor([True, True, False, True]), torch.tensor([3, 0])),
    }


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_opcheck(name, records_fd):
    """Schema mutation annotations, autograd registration, fake kernel vs real kernel, AOT dispatch."""
    torch.library.opcheck(getattr(torch.ops.torchrec_ascend, name).default, opcheck_cases(records_fd)[name])


def meta(*shape, dtype=torch.int64):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_meta_device_shapes():
    buckets, free_slots, counters = meta(64, 2), meta(16), meta(2)
    slots, is_new = ops.id_map_insert_or_lookup(buckets, free_slots, counters, meta(10))
    assert (slots.shape, slots.dtype, is_new.shape, is_new.dtype) == ((10,), torch.int64, (10,), torch.bool)
    assert ops.id_map_lookup(buckets, meta(7)).shape == (7,)
    assert ops.id_map_remove(buckets, free_slots, counters, meta(3)).shape == (3,)
    assert ops.id_map_rebuild(buckets, free_slots, counters, meta(3), meta(3)) is None
    assert ops.hash_rank(meta(9), 4).shape == (9,)
    new_lengths, new_values, new_weights, permute = ops.hash_bucketize(
        meta(6, dtype=torch.int32), meta(11), meta(11, dtype=torch.float16), 4
    )
    assert (new_lengths.shape, new_lengths.dtype) == ((24,), torch.int32)
    assert new_values.shape == permute.shape == new_weights.shape == (11,)
    assert new_weights.dtype == torch.float16
    assert ops.hash_bucketize(meta(6), meta(11), None, 2)[2] is None
    rows = ops.hash_uniform_init(meta(5), 0, 3, 0.0, 1.0)
    assert (rows.shape, rows.dtype) == ((5, 3), torch.float32)


def test_data_dependent_sizes_are_unbacked_symbols_under_fake_tensors():
    with FakeTensorMode(shape_env=ShapeEnv()):
        unique, inverse, counts = ops.hash_unique(torch.empty(12, dtype=torch.int64))
        exported_ids, exported_slots = ops.id_map_export(torch.empty(64, 2, dtype=torch.int64), torch.empty(2))
        state = torch.empty(64, 2, dtype=torch.int64), torch.empty(16, dtype=torch.int64), torch.empty(2)
        slots, new_positions, hits = ops.id_map_insert_stamped(*state, torch.empty(16, dtype=torch.int64),
                                                               torch.empty(10, dtype=torch.int64), 3)
    assert isinstance(unique.shape[0], torch.SymInt) and str(unique.shape[0]) == str(counts.shape[0])
    assert inverse.shape == (12,)
    assert isinstance(exported_ids.shape[0], torch.SymInt)
    assert str(exported_ids.shape[0]) == str(exported_slots.shape[0]) != str(unique.shape[0])
    assert slots.shape == (10,) and hits.shape == () and isinstance(new_positions.shape[0], torch.SymInt)

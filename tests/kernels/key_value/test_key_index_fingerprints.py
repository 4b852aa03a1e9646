"""The disk tier's fingerprint index (native fingerprint_find / fingerprint_insert) against a dict model, and a
DiskStore holding keys whose partition and fingerprint collide (a probe goes on past the other key's record)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.errors import CapacityError
from torchrec_ascend.kernels.key_value.disk_store import FINGERPRINT_BITS, PARTITIONS, DiskStore
from torchrec_ascend.kernels.key_value.key_index import DISK_LOW_LOAD, MAX_LOAD, OpenTable, mix64
from torchrec_ascend.native import ops

BITS = 8  # few fingerprints, so that many entries share one
SHIFT = 64 - BITS


def candidates(table, part, fingerprint):
    """Every bucket a probe for (part, fingerprint) offers, following `after` until it says -1."""
    found, after = [], -1
    while True:
        (bucket,) = ops.fingerprint_find(*table.state[:2], torch.tensor([part]), torch.tensor([fingerprint]),
                                         torch.tensor([after]), BITS).tolist()
        if bucket < 0:
            return found
        found.append(bucket)
        after = bucket


ENTRY = st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(1, 2**20))  # partition, fingerprint, location


@settings(deadline=None, max_examples=40)
@given(st.lists(st.tuples(st.booleans(), st.lists(ENTRY, max_size=40)), max_size=12))
def test_probes_offer_exactly_the_entries_of_a_fingerprint(steps):
    table, model = OpenTable(np.uint64, 4, 4096), {}  # bucket -> (partition, fingerprint, location)
    for is_insert, entries in steps:
        if is_insert:
            held = {loc for _, _, loc in model.values()}
            fresh = list({loc: (p, f, loc) for p, f, loc in entries if loc not in held}.values())  # distinct entries
            part = np.array([p for p, _, _ in fresh], dtype=np.int64)
            values = np.array([f << SHIFT | loc for _, f, loc in fresh], dtype=np.uint64)
            assert ops.fingerprint_insert(*table.state, torch.from_numpy(part), torch.from_numpy(values.view(np.int64)),
                                          BITS, MAX_LOAD, DISK_LOW_LOAD) == -1
            # buckets move when a partition is rebuilt: re-read the model from the table
            stored, buckets = table.entries()
            by_value = {int(v): int(b) for v, b in zip(stored, buckets)}
            model = {by_value[f << SHIFT | loc]: (p, f, loc) for p, f, loc in list(model.values()) + fresh}
        else:  # remove the entries at the given locations
            gone = [b for b, (_, _, loc) in model.items() if loc in {e[2] for e in entries}]
            table.remove(np.array(gone, dtype=np.int64))
            for b in gone:
                del model[b]
        assert len(table) == len(model)
        assert (table.used <= MAX_LOAD * table.size).all()
        for p in range(4):
            for f in range(6):
                got = candidates(table, p, f)
                assert len(got) == len(set(got))
                assert sorted(got) == sorted(b for b, (q, g, _) in model.items() if (q, g) == (p, f))
                for b in got:
                    assert b // table.stride == p


def test_insert_that_would_outgrow_a_partition_changes_nothing():
    table = OpenTable(np.uint64, 2, 16)
    part = torch.tensor([1] * 8)
    assert ops.fingerprint_insert(*table.state, part, torch.arange(1, 9), BITS, MAX_LOAD, DISK_LOW_LOAD) == -1
    before = [t.clone() for t in table.state]
    # 8 + 6 keys need ceil(14 / DISK_LOW_LOAD) + 1 = 22 buckets, more than the 16 reserved
    assert ops.fingerprint_insert(*table.state, torch.tensor([0, 1, 1, 1, 1, 1]), torch.arange(9, 15), BITS,
                                  MAX_LOAD, DISK_LOW_LOAD) == 1
    assert all(torch.equal(a, b) for a, b in zip(before, table.state))


def test_fingerprint_ops_name_the_bad_argument():
    table = OpenTable(np.uint64, 2, 16)
    with pytest.raises(ValueError, match="part"):
        ops.fingerprint_insert(*table.state, torch.tensor([2]), torch.tensor([5]), BITS, MAX_LOAD, DISK_LOW_LOAD)
    with pytest.raises(ValueError, match="empty buckets and tombstones"):
        ops.fingerprint_insert(*table.state, torch.tensor([0]), torch.tensor([0]), BITS, MAX_LOAD, DISK_LOW_LOAD)
    with pytest.raises(ValueError, match="after"):
        ops.fingerprint_find(*table.state[:2], torch.tensor([0]), torch.tensor([1]), torch.tensor([40]), BITS)


def colliding_keys(count):
    """Pairs of distinct keys with the same partition and fingerprint in the disk index (a birthday search over
    the 36 hash bits that pick both)."""
    keys = np.arange(1, 1 << 20, dtype=np.int64) * 0x9E3779B1
    h = mix64(keys.view(np.uint64))
    slot = (h >> np.uint64(64 - FINGERPRINT_BITS)) * np.uint64(PARTITIONS) + (h & np.uint64(PARTITIONS - 1))
    order = np.argsort(slot, kind="stable")
    same = np.flatnonzero(slot[order][1:] == slot[order][:-1])[:count]
    assert same.size == count
    return keys[order[same]], keys[order[same + 1]]


def rows(keys):
    return keys.double().unsqueeze(1).repeat(1, 3).float()


def test_disk_store_tells_colliding_keys_apart(tmp_path):
    first, second = (torch.from_numpy(k) for k in colliding_keys(4))
    with DiskStore(str(tmp_path), 3, name="t") as store:
        store.put(first, rows(first))
        assert not store.contains(second).any()  # the probe meets first's bucket, reads its record, goes on
        store.put(second, rows(second))
        got, found = store.get(torch.cat([second, first]))
        assert found.all() and torch.equal(got, rows(torch.cat([second, first])))
        store.remove(first)
        got, found = store.get(torch.cat([first, second]))
        assert found.tolist() == [False] * 4 + [True] * 4 and torch.equal(got[4:], rows(second))
        store.put(first, rows(first) + 1)  # a tombstone may sit before second's bucket now
        got, found = store.pop(torch.cat([first, second]))
        assert found.all() and torch.equal(got, torch.cat([rows(first) + 1, rows(second)]))
        assert len(store) == 0


def test_disk_store_over_its_reserved_buckets_raises_capacity_error(tmp_path, monkeypatch):
    import torchrec_ascend.kernels.key_value.disk_store as disk_store

    monkeypatch.setattr(disk_store, "MAX_BUCKETS", 16)
    with DiskStore(str(tmp_path), 1, name="tiny") as store:
        with pytest.raises(CapacityError, match="disk store of table 'tiny'"):
            store.put(torch.arange(20_000), torch.zeros(20_000, 1))

"""Fuzzing the disk tier's readers: damaged segment files give back exactly what was written or a StorageError.

Segment files are filled through the DiskStore (puts, overwrites, removes, compactions), then damaged the ways a
disk or a careless hand damages them: truncations, bit flips, records shuffled or duplicated within and across
files, records zeroed. The oracle: every read (``get`` of all keys, of each key alone, ``contains``, ``chunks``)
returns exactly the rows written (found where written, absent where not) or raises ``StorageError`` naming a
segment file; it never returns another row, never misses a written key silently, never crashes.

``TORCHREC_ASCEND_FUZZ_EXAMPLES`` sets the number of examples (default 60, the bounded CI profile; the longer run
is ``TORCHREC_ASCEND_FUZZ_EXAMPLES=5000 pytest tests/kernels/key_value/test_disk_fuzz.py``).
"""

import glob
import os
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchrec_ascend.errors import StorageError
from torchrec_ascend.kernels.key_value.disk_record import RecordFormat
from torchrec_ascend.kernels.key_value.disk_store import DiskStore

WIDTH = 3
RECORD = RecordFormat(WIDTH, torch.float32).nbytes
POOL = [0, 1, 2, 3, 5, 8, 13, 2**31, 2**40 + 1, 2**63 - 1]
EXAMPLES = int(os.environ.get("TORCHREC_ASCEND_FUZZ_EXAMPLES", "60"))

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.lists(st.sampled_from(POOL), min_size=1, max_size=6)),
        st.tuples(st.just("remove"), st.lists(st.sampled_from(POOL), max_size=3)),
    ),
    min_size=1,
    max_size=8,
)
DAMAGE = st.lists(
    st.one_of(
        st.tuples(st.just("truncate"), st.integers(0, 50), st.integers(1, 3 * RECORD)),
        st.tuples(st.just("flip"), st.integers(0, 50), st.integers(0, 5 * RECORD * 8)),
        st.tuples(st.just("shuffle"), st.integers(0, 50), st.integers(0, 2**32)),
        st.tuples(st.just("duplicate"), st.integers(0, 50), st.integers(0, 50)),
        st.tuples(st.just("zero"), st.integers(0, 50), st.integers(0, 50)),
    ),
    min_size=1,
    max_size=3,
)


def rows_for(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (n, WIDTH), generator=g, dtype=torch.int64)
    return bits.to(torch.int32).view(torch.float32)


def as_bytes(row: torch.Tensor) -> bytes:
    return row.contiguous().view(torch.uint8).numpy().tobytes()


def records_of(path: str) -> list:
    data = open(path, "rb").read()
    return [data[i : i + RECORD] for i in range(0, len(data), RECORD)]


def damage(files: list, kind: str, a: int, b: int) -> None:
    if not files:
        return
    path = files[a % len(files)]
    size = os.path.getsize(path)
    if kind == "truncate":
        os.truncate(path, max(0, size - b))
    elif kind == "flip" and size:
        bit = b % (size * 8)
        with open(path, "r+b") as f:
            f.seek(bit // 8)
            byte = f.read(1)[0]
            f.seek(bit // 8)
            f.write(bytes([byte ^ (1 << (bit % 8))]))
    elif kind == "shuffle":
        records = records_of(path)
        random.Random(b).shuffle(records)
        open(path, "wb").write(b"".join(records))
    elif kind == "duplicate":  # a record of one file copied over a record of another (or the same) file
        source = records_of(files[b % len(files)])
        target = records_of(path)
        if source and target and len(source[0]) == len(target[0]) == RECORD:
            target[b % len(target)] = source[a % len(source)]
            open(path, "wb").write(b"".join(target))
    elif kind == "zero" and size >= RECORD:
        with open(path, "r+b") as f:
            f.seek((b % (size // RECORD)) * RECORD)
            f.write(bytes(RECORD))


def check_read(read, model: dict, keys: list) -> None:
    """``read(keys) -> (rows, found)`` gives exactly the model, or raises StorageError naming a segment file."""
    try:
        rows, found = read(keys)
    except StorageError as error:
        assert "segment-" in str(error)
        return
    for i, k in enumerate(keys):
        assert bool(found[i]) == (k in model), f"key {k}: found={bool(found[i])}, written={k in model}"
        assert as_bytes(rows[i]) == model.get(k, bytes(4 * WIDTH))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, damages=DAMAGE)
def test_damaged_segments_read_back_exactly_or_raise(tmp_path_factory, ops, damages):
    with DiskStore(str(tmp_path_factory.mktemp("fuzz")), WIDTH, name="t", segment_bytes=3 * RECORD) as store:
        model = {}
        for step, (kind, keys) in enumerate(ops):
            tensor = torch.tensor(keys, dtype=torch.int64)
            if kind == "put":
                rows = rows_for(len(keys), step)
                store.put(tensor, rows)
                model.update((k, as_bytes(rows[i])) for i, k in enumerate(keys))
            else:
                store.remove(tensor)
                for k in keys:
                    model.pop(k, None)
        files = sorted(glob.glob(os.path.join(store.path, "*.rows")))
        for kind, a, b in damages:
            damage(files, kind, a, b)
        keys = POOL + [4, 99]
        check_read(lambda ks: store.get(torch.tensor(ks, dtype=torch.int64)), model, keys)
        for k in keys:
            check_read(lambda ks: store.get(torch.tensor(ks, dtype=torch.int64)), model, [k])
            try:
                assert bool(store.contains(torch.tensor([k]))[0]) == (k in model)
            except StorageError as error:
                assert "segment-" in str(error)
        try:
            listed = {}
            for chunk_keys, chunk_rows in store.chunks(rows_per_chunk=2):
                for i, k in enumerate(chunk_keys.tolist()):
                    assert k not in listed
                    listed[k] = as_bytes(chunk_rows[i])
            assert listed == model
        except StorageError as error:
            assert "segment-" in str(error)


def test_a_symlink_planted_at_the_next_segment_name_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere.rows"
    with DiskStore(str(tmp_path / "store"), WIDTH, name="t", segment_bytes=2 * RECORD) as store:
        store.put(torch.tensor([1, 2]), rows_for(2, 0))  # fills segment 0: the next put opens segment 1
        os.symlink(elsewhere, os.path.join(store.path, "segment-000001.rows"))
        with pytest.raises(StorageError, match=r"segment-000001.*nothing was stored"):
            store.put(torch.tensor([3]), rows_for(1, 1))
        assert not elsewhere.exists()  # nothing was created or written through the link
        got, found = store.get(torch.tensor([1, 2, 3]))
        assert found.tolist() == [True, True, False] and as_bytes(got[:2]) == as_bytes(rows_for(2, 0))


def test_every_segment_file_stays_inside_the_store_folder(tmp_path):
    with DiskStore(str(tmp_path), WIDTH, name="../../evil/name", segment_bytes=2 * RECORD) as store:
        store.put(torch.arange(7), rows_for(7, 2))
        root = os.path.realpath(str(tmp_path))
        assert os.path.realpath(store.path).startswith(root + os.sep)
        files = [os.path.join(d, f) for d, _, names in os.walk(root) for f in names]
        assert len(files) == 4 and all(os.path.dirname(f) == store.path for f in files)

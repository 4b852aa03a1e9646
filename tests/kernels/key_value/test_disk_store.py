"""DiskStore: exact bytes back, compaction, and failures (corruption, truncation, full disk, lost directory)."""

import errno
import glob
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.errors import ConfigError, StorageError
from torchrec_ascend.kernels.key_value import disk_store
from torchrec_ascend.kernels.key_value.disk_record import RecordFormat
from torchrec_ascend.kernels.key_value.disk_store import DiskStore

WIDTH = 6


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality: NaN payloads and -0.0 included (torch.equal treats NaN != NaN)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def special_rows(n: int) -> torch.Tensor:
    """float32 rows full of values that a float round trip would alter: NaN payloads, -0.0, denormals, inf."""
    bits = torch.tensor(
        [0x7FC00001, 0x7F800123, 0xFFC0BEEF, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F800000, 0x3F800000],
        dtype=torch.int64,
    ).to(torch.int32)
    return bits.repeat(n * WIDTH // bits.numel() + 1)[: n * WIDTH].roll(n).view(torch.float32).reshape(n, WIDTH)


def random_rows(n: int, seed: int, width: int = WIDTH) -> torch.Tensor:
    """Rows of random bit patterns (every float32 class occurs, NaNs with payloads included)."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (n, width), generator=g, dtype=torch.int64)
    return bits.to(torch.int32).view(torch.float32)


@pytest.fixture
def store(tmp_path):
    with DiskStore(str(tmp_path), WIDTH, name="user_id") as s:
        yield s


def segment_files(store: DiskStore):
    return sorted(glob.glob(os.path.join(store.path, "*.rows")))


def test_round_trip_is_byte_exact(store):
    keys = torch.tensor([0, 1, 2**63 - 1, 12345, 7, 8, 9, 2**40])
    rows = special_rows(keys.numel())
    store.put(keys, rows)
    got, found = store.get(keys.flip(0))
    assert found.all() and same_bytes(got, rows.flip(0))
    assert len(store) == keys.numel()


@pytest.mark.parametrize("dtype,width", [(torch.bfloat16, 3), (torch.float16, 5), (torch.float64, 2), (torch.int8, 7)])
def test_other_dtypes_and_unaligned_widths(tmp_path, dtype, width):
    rows = torch.randint(0, 256, (4, width * torch.empty(0, dtype=dtype).element_size()), dtype=torch.uint8)
    rows = rows.view(dtype)
    with DiskStore(str(tmp_path), width, dtype=dtype) as store:
        store.put(torch.tensor([4, 3, 2, 1]), rows)
        got, found = store.get(torch.tensor([1, 2, 3, 4, 5]))
    assert found.tolist() == [True] * 4 + [False]
    assert same_bytes(got[:4], rows.flip(0)) and not got[4].any()


def test_repeated_keys_last_row_wins_and_get_allows_repeats(store):
    store.put(torch.tensor([5, 6, 5]), torch.tensor([[1.0] * WIDTH, [2.0] * WIDTH, [3.0] * WIDTH]))
    got, found = store.get(torch.tensor([5, 5, 6]))
    assert found.all() and got[:, 0].tolist() == [3.0, 3.0, 2.0]
    assert len(store) == 2


def test_pop_and_remove(store):
    store.put(torch.arange(5), random_rows(5, 0))
    rows, found = store.pop(torch.tensor([1, 9, 1]))
    assert found.tolist() == [True, False, True] and same_bytes(rows[0], random_rows(5, 0)[1])
    store.remove(torch.tensor([2, 2, 42]))
    assert store.get(torch.arange(5))[1].tolist() == [True, False, False, True, True]
    assert len(store) == 3


def test_chunks_cover_every_row_once(tmp_path):
    with DiskStore(str(tmp_path), WIDTH, segment_bytes=5 * RecordFormat(WIDTH, torch.float32).nbytes) as store:
        keys = torch.arange(100, 123)
        store.put(keys, random_rows(23, 1))
        seen = list(store.chunks(rows_per_chunk=4))
    assert all(k.numel() <= 4 for k, _ in seen)
    got_keys = torch.cat([k for k, _ in seen])
    order = got_keys.argsort()
    assert torch.equal(got_keys[order], keys)
    assert same_bytes(torch.cat([r for _, r in seen])[order], random_rows(23, 1))


def test_chunks_refuse_to_continue_after_a_change(store):
    store.put(torch.arange(4), random_rows(4, 2))
    chunks = store.chunks(rows_per_chunk=2)
    next(chunks)
    store.remove(torch.tensor([3]))
    with pytest.raises(RuntimeError, match="changed while"):
        next(chunks)


def test_compaction_reclaims_garbage_and_keeps_rows(tmp_path):
    record = RecordFormat(WIDTH, torch.float32).nbytes
    with DiskStore(str(tmp_path), WIDTH, segment_bytes=8 * record, compact_fraction=0.5) as store:
        keys = torch.arange(20)
        for version in range(10):  # every put overwrites all 20 rows
            store.put(keys, random_rows(20, version))
        stats = store.stats()
        got, found = store.get(keys)
    assert found.all() and same_bytes(got, random_rows(20, 9))
    assert stats["compactions"] > 0
    # live 20 records; sealed segments hold < 50% garbage, plus at most the active and one new segment
    assert stats["file_bytes"] <= 2 * 20 * record + 2 * 8 * record
    assert stats["live_bytes"] == 20 * record


def test_corrupted_byte_is_detected_and_names_file_and_key(store):
    keys = torch.tensor([10, 11, 12, 13])
    store.put(keys, random_rows(4, 3))
    (path,) = segment_files(store)
    record = RecordFormat(WIDTH, torch.float32).nbytes
    with open(path, "r+b") as f:  # flip one payload bit of key 12's record (the third written)
        f.seek(2 * record + 16 + 5)
        byte = f.read(1)[0]
        f.seek(2 * record + 16 + 5)
        f.write(bytes([byte ^ 0x10]))
    with pytest.raises(StorageError, match=rf"{os.path.basename(path)}.*\[12\]"):
        store.get(torch.tensor([11, 12]))
    with pytest.raises(StorageError):
        store.pop(torch.tensor([12]))
    got, found = store.get(torch.tensor([10, 11, 13]))  # the other rows are intact
    assert found.all() and same_bytes(got, random_rows(4, 3)[[0, 1, 3]])
    assert len(store) == 4  # the failed pop removed nothing


def test_truncated_file_is_detected_and_names_file_and_key(store):
    keys = torch.tensor([20, 21, 22])
    store.put(keys, random_rows(3, 4))
    (path,) = segment_files(store)
    os.truncate(path, os.path.getsize(path) - 3)
    with pytest.raises(StorageError, match=rf"{os.path.basename(path)}.*truncated.*\[22\]"):
        store.get(keys)
    got, found = store.get(keys[:2])
    assert found.all() and same_bytes(got, random_rows(3, 4)[:2])
    store.put(torch.tensor([23]), random_rows(1, 5))  # still writable
    assert same_bytes(store.get(torch.tensor([23]))[0], random_rows(1, 5))


def test_every_single_bit_flip_fails_the_checksum():
    fmt = RecordFormat(width=3, dtype=torch.float32)
    records = fmt.encode(torch.tensor([2**62 + 7]), random_rows(1, 6, width=3))
    bits = fmt.nbytes * 8
    flipped = records.repeat(bits, axis=0).view("u1")
    flipped[np.arange(bits), np.arange(bits) // 8] ^= (1 << (np.arange(bits) % 8)).astype(np.uint8)
    flipped = flipped.view("u8")
    assert (fmt.checksums(flipped) != flipped[:, 1]).all()  # the checksum alone catches every flip, key included
    assert not fmt.damaged(records, torch.tensor([2**62 + 7])).any()
    assert fmt.damaged(records, torch.tensor([2**62 + 8])).all()  # an intact record of another key
    assert fmt.damaged(records * 0, torch.tensor([0])).all()  # an all-zero record (a hole) is invalid


def test_full_disk_fails_the_put_and_changes_nothing(tmp_path, monkeypatch):
    record = RecordFormat(WIDTH, torch.float32).nbytes
    with DiskStore(str(tmp_path), WIDTH, name="item_id", segment_bytes=3 * record) as store:
        store.put(torch.arange(4), random_rows(4, 7))  # segment 0 full, segment 1 holds one record
        state = lambda: ({k: v for k, v in store.stats().items() if k != "records_read"},
                         sorted(os.path.getsize(p) for p in segment_files(store)))
        before = state()
        real = os.pwrite
        calls = []

        def pwrite(fd, data, offset):  # half of the first write lands, then the disk is full
            calls.append(len(data))
            if len(calls) == 1:
                return real(fd, bytes(data[: len(data) // 2]), offset)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "pwrite", pwrite)
        with pytest.raises(StorageError, match=r"item_id.*No space left on device.*nothing was stored"):
            store.put(torch.tensor([2, 50, 51, 52]), random_rows(4, 8))  # would span two segments
        monkeypatch.undo()
        assert state() == before  # the rows, files and counters of writes are unchanged (reads to verify happen)
        got, found = store.get(torch.tensor([0, 1, 2, 3, 50]))
        assert found.tolist() == [True] * 4 + [False] and same_bytes(got[:4], random_rows(4, 7))
        store.put(torch.tensor([2, 50]), random_rows(2, 9))  # usable again once there is room
        got, found = store.get(torch.tensor([2, 50, 3]))
        assert found.all() and same_bytes(got[:2], random_rows(2, 9)) and same_bytes(got[2], random_rows(4, 7)[3])


def test_unwritable_directory_is_reported_at_creation(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match=r"item_id.*a_file.*writable"):
        DiskStore(str(blocker / "cache"), WIDTH, name="item_id")


def test_directory_lost_midway_fails_the_put_and_keeps_rows(tmp_path):
    record = RecordFormat(WIDTH, torch.float32).nbytes
    with DiskStore(str(tmp_path), WIDTH, name="item_id", segment_bytes=2 * record) as store:
        store.put(torch.tensor([1, 2]), random_rows(2, 10))  # fills segment 0: the next put needs a new file
        os.rename(store.path, store.path + ".moved")
        with open(store.path, "w") as blocker:  # the directory is now a regular file: no file can be created in it
            blocker.write("x")
        with pytest.raises(StorageError, match=r"item_id.*segment-000001.*nothing was stored"):
            store.put(torch.tensor([3]), random_rows(1, 11))
        got, found = store.get(torch.tensor([1, 2, 3]))  # open files stay readable
        assert found.tolist() == [True, True, False] and same_bytes(got[:2], random_rows(2, 10))
        os.remove(store.path)
        os.rename(store.path + ".moved", store.path)
        store.put(torch.tensor([3]), random_rows(1, 11))
        assert same_bytes(store.get(torch.tensor([3]))[0], random_rows(1, 11))


@pytest.mark.parametrize(
    "keys,rows,message",
    [
        (torch.tensor([1, -2]), torch.zeros(2, WIDTH), "negative keys \\[-2\\]"),
        (torch.tensor([1.0]), torch.zeros(1, WIDTH), "torch.int64"),
        (torch.tensor([[1]]), torch.zeros(1, WIDTH), "1-D"),
        (torch.tensor([1]), torch.zeros(1, WIDTH, dtype=torch.float64), "must be torch.float32"),
        (torch.tensor([1]), torch.zeros(1, WIDTH + 1), "\\[1, 6\\]"),
    ],
)
def test_malformed_input_is_rejected_by_name(store, keys, rows, message):
    with pytest.raises(ConfigError, match=f"user_id.*{message}"):
        store.put(keys, rows)
    assert len(store) == 0


def test_closed_store_refuses_calls_and_deletes_its_directory(tmp_path):
    store = DiskStore(str(tmp_path), WIDTH, name="t")
    store.put(torch.tensor([1]), torch.zeros(1, WIDTH))
    store.close()
    store.close()
    assert not os.path.exists(store.path)
    with pytest.raises(StorageError, match="closed"):
        store.get(torch.tensor([1]))


@settings(deadline=None, max_examples=25)
@given(st.lists(st.lists(st.integers(0, 2**63 - 1), max_size=5), max_size=5))
def test_any_keys_round_trip(tmp_path_factory, batches):
    with DiskStore(str(tmp_path_factory.mktemp("disk")), WIDTH, segment_bytes=3 * 64) as store:
        model = {}
        for i, batch in enumerate(batches):
            rows = random_rows(len(batch), i)
            store.put(torch.tensor(batch, dtype=torch.int64), rows)
            model.update((k, rows[j]) for j, k in enumerate(batch))
        keys = torch.tensor(list(model), dtype=torch.int64)
        got, found = store.get(keys)
        assert found.all() and all(same_bytes(got[j], model[k]) for j, k in enumerate(model))


def test_bulk_load_fills_an_empty_store_exactly_and_refuses_repeats(tmp_path):
    record = RecordFormat(WIDTH, torch.float32).nbytes
    keys = torch.randint(0, 2**63 - 1, (5000,), generator=torch.Generator().manual_seed(3)).unique()
    rows = random_rows(keys.numel(), 12)
    with DiskStore(str(tmp_path), WIDTH, segment_bytes=700 * record) as store:
        assert store.bulk_load(zip(keys.split(999), rows.split(999))) == keys.numel()
        got, found = store.get(keys.flip(0))
        assert found.all() and same_bytes(got, rows.flip(0))
        store.put(keys[:3], random_rows(3, 13))  # an ordinary store afterwards
        assert same_bytes(store.get(keys[:4])[0], torch.cat([random_rows(3, 13), rows[3:4]]))
        with pytest.raises(ConfigError, match="empty store"):
            store.bulk_load(iter([(torch.tensor([2**62]), random_rows(1, 0))]))
    with DiskStore(str(tmp_path), WIDTH) as store:
        with pytest.raises(ConfigError, match="more than once"):
            store.bulk_load(iter([(torch.tensor([1, 2]), random_rows(2, 0)), (torch.tensor([2]), random_rows(1, 1))]))
        assert len(store) == 0 and not segment_files(store)


def test_bulk_load_writes_behind_and_drops_what_it_wrote(tmp_path, monkeypatch):
    record = RecordFormat(WIDTH, torch.float32).nbytes
    monkeypatch.setattr(disk_store, "BULK_WRITE_BEHIND", 50 * record)
    keys = torch.randint(0, 2**63 - 1, (3000,), generator=torch.Generator().manual_seed(5)).unique()
    rows = random_rows(keys.numel(), 14)
    synced, dropped = [], {}  # fds synced in order; per path, the spans dropped from the page cache
    real_sync, real_advise = os.fdatasync, os.posix_fadvise

    def fdatasync(fd):
        synced.append(fd)
        real_sync(fd)

    def posix_fadvise(fd, offset, length, advice):
        assert synced and synced[-1] == fd and advice == os.POSIX_FADV_DONTNEED  # dropped only once written out
        dropped.setdefault(os.readlink(f"/proc/self/fd/{fd}"), []).append((offset, offset + length))
        real_advise(fd, offset, length, advice)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "posix_fadvise", posix_fadvise)
    with DiskStore(str(tmp_path), WIDTH, segment_bytes=700 * record) as store:
        store.bulk_load(zip(keys.split(999), rows.split(999)))
        monkeypatch.undo()
        got, found = store.get(keys)
        assert found.all() and same_bytes(got, rows)
        files = segment_files(store)
        assert len(files) == -(-keys.numel() // 700) and sorted(dropped) == files
        for path, spans in dropped.items():  # written behind from the start, in order, never past the file's end
            ends = [0] + [end for _, end in spans]
            assert [start for start, _ in spans] == ends[:-1] and ends[-1] <= os.path.getsize(path)
            assert os.path.getsize(path) - ends[-1] < 50 * record  # less than the threshold is left behind


def test_bulk_load_that_cannot_sync_loads_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_store, "BULK_WRITE_BEHIND", 1)

    def fdatasync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with DiskStore(str(tmp_path), WIDTH, name="item_id") as store:
        with pytest.raises(StorageError, match=r"item_id.*Input/output error.*nothing was stored"):
            store.bulk_load(iter([(torch.arange(10), random_rows(10, 15))]))
        monkeypatch.undo()
        assert len(store) == 0 and not segment_files(store)
        store.bulk_load(iter([(torch.arange(10), random_rows(10, 15))]))  # usable once the disk works
        assert same_bytes(store.get(torch.arange(10))[0], random_rows(10, 15))

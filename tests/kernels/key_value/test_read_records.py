"""The disk tier's batched random read (``segment_file.read_records`` over the native ``read_records`` op) against
plain Python slicing of the files' bytes, and its failures."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.errors import StorageError
from torchrec_ascend.kernels.key_value.segment_file import SegmentFile, read_records
from torchrec_ascend.native import ops


def filled(directory: str, words: int, counts: list, seed: int) -> list:
    rng = np.random.default_rng(seed)
    segments = []
    for segment_id, count in enumerate(counts):
        seg = SegmentFile(directory, words, segment_id)
        seg.append(rng.integers(0, 2**63, size=(count, words), dtype=np.uint64))
        segments.append(seg)
    return segments


def bytes_of(seg: SegmentFile) -> bytes:
    with open(seg.path, "rb") as f:
        return f.read()


@settings(max_examples=40, deadline=None)
@given(
    words=st.integers(1, 40),  # records from 8 bytes to 320: within a page, across page ends, many per page
    counts=st.lists(st.integers(1, 300), min_size=1, max_size=4),
    picks=st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1, exclude_max=True)), max_size=200),
    seed=st.integers(0, 2**16),
)
def test_records_match_the_files_bytes(tmp_path_factory, words, counts, picks, seed):
    segments = filled(str(tmp_path_factory.mktemp("seg")), words, counts, seed)
    try:
        which = np.array([f % len(segments) for f, _ in picks], dtype=np.int64)
        offsets = np.array([int(u * counts[f % len(segments)]) for f, u in picks], dtype=np.int64)
        got = read_records(segments, which, offsets)
        size = 8 * words
        contents = [bytes_of(seg) for seg in segments]
        expected = b"".join(contents[w][o * size : (o + 1) * size] for w, o in zip(which.tolist(), offsets.tolist()))
        assert got.shape == (len(picks), words) and got.dtype == np.uint64
        assert got.tobytes() == expected
    finally:
        for seg in segments:
            seg.close()


def test_a_record_past_the_end_of_its_file_names_the_file(tmp_path):
    seg_a, seg_b = filled(str(tmp_path), 4, [3, 5], seed=0)
    with pytest.raises(StorageError, match=r"segment-000001\.rows': record 5 \(32 bytes at byte 160\).*ends at 160"):
        read_records([seg_a, seg_b], np.array([0, 1, 1]), np.array([2, 4, 5]))


def test_the_op_reports_the_first_failed_record_in_file_order_with_its_errno(tmp_path):
    (seg,) = filled(str(tmp_path), 2, [4], seed=1)
    fd = os.open(seg.path, os.O_RDONLY)
    out = torch.zeros(3, 2, dtype=torch.int64)
    try:
        # file order 3, 6, 9: record 3 is read, 6 (index 2) is past the end, 9 is not tried
        assert ops.read_records(torch.tensor([fd] * 3), torch.tensor([9, 3, 6]), 16, out).tolist() == [2, 0]
        assert out[1].numpy().view(np.uint8).tobytes() == bytes_of(seg)[48:64] and out[0].tolist() == [0, 0]
        assert ops.read_records(torch.tensor([fd] * 3), torch.tensor([3, 0, 1]), 16, out).tolist() == [-1, 0]
    finally:
        os.close(fd)
    assert ops.read_records(torch.tensor([fd]), torch.tensor([0]), 16, out[:1]).tolist() == [0, errno.EBADF]


@pytest.mark.parametrize(
    "args, message",
    [
        ((torch.tensor([0, 0]), torch.tensor([1]), 8, torch.empty(1)), "one element per record"),
        ((torch.tensor([0]), torch.tensor([-1]), 8, torch.empty(2, dtype=torch.int32)), r"offsets\[0\] = -1"),
        ((torch.tensor([-3]), torch.tensor([1]), 8, torch.empty(2, dtype=torch.int32)), r"fds\[0\] = -3"),
        ((torch.tensor([0]), torch.tensor([1]), 8, torch.empty(3, dtype=torch.int32)),
         "must be a contiguous CPU tensor of 8 bytes"),
        ((torch.tensor([0]), torch.tensor([1]), 0, torch.empty(0)), "record_bytes must be > 0"),
    ],
)
def test_bad_arguments_are_refused_before_any_read(args, message):
    with pytest.raises(ValueError, match=message):
        ops.read_records(*args)

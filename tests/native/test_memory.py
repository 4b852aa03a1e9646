"""huge_page_full against torch.full (the oracle): same values, shape, dtype and layout, whatever the size; plain_empty
against np.empty: same shape, dtype and layout, and memory without the huge-page advice numpy gives large arrays;
no_numpy_huge_pages: no advice inside, numpy's own setting back after, however blocks nest or overlap in threads;
reused_buffers: a freed plain_empty buffer is reused, never while any view or tensor of it lives, within the block's
limit (the size freed last kept first), none kept after;
reserve against np.zeros, its pages resident only once written."""

from __future__ import annotations

import gc
import sys
import threading
from typing import Dict, List

import numpy as np
import pytest
import torch

from torchrec_ascend.native import memory
from torchrec_ascend.native.memory import (
    HUGE_PAGE,
    KeptBuffers,
    huge_page_full,
    no_numpy_huge_pages,
    plain_empty,
    reserve,
    reused_buffers,
)


@pytest.mark.parametrize(
    "shape, value, dtype",
    [
        ((0, 2), -1, torch.int64),  # empty: nothing to advise
        ((16, 2), -1, torch.int64),  # smaller than one huge page
        ((3 * HUGE_PAGE // 16 + 5, 2), -1, torch.int64),  # spans whole huge pages and ragged ends
        ((HUGE_PAGE + 3,), 7, torch.int32),
    ],
)
def test_equals_torch_full(shape, value, dtype) -> None:
    out = huge_page_full(shape, value, dtype)
    expected = torch.full(shape, value, dtype=dtype)
    assert out.dtype == dtype and out.shape == expected.shape and out.is_contiguous() and out.device.type == "cpu"
    assert torch.equal(out, expected)


@pytest.mark.parametrize(
    "shape, dtype",
    [((0,), np.int64), ((0, 36), np.uint64), ((5,), np.int8), ((3, 7), np.float32), ((1 << 20, 4), np.uint64)],
)
def test_plain_empty_is_like_np_empty(shape, dtype) -> None:
    out = plain_empty(shape, dtype)
    expected = np.empty(shape, dtype)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert out.flags.c_contiguous and out.flags.writeable
    out[...] = 3
    gc.collect()  # the array alone keeps its memory: nothing it was made from is referenced elsewhere
    assert (out == 3).all()


def mapping_fields(address: int) -> Dict[str, List[str]]:
    """The /proc/self/smaps fields of the mapping holding ``address`` (``VmFlags`` ``hg``: advised huge pages;
    ``Rss``: resident kB)."""
    fields: Dict[str, List[str]] = {}
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):  # a mapping's first line: start-end perms ...
                if inside:
                    return fields
                start, end = (int(bound, 16) for bound in first.split("-"))
                inside = start <= address < end
            elif inside:
                fields[first.rstrip(":")] = line.split()[1:]
    if inside:
        return fields
    raise AssertionError(f"no mapping holds address {address:#x}")


def vm_flags(address: int) -> List[str]:
    return mapping_fields(address)["VmFlags"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge-page advice is Linux's")
def test_plain_empty_memory_is_not_advised_huge_pages() -> None:
    size = (1 << 20, 4)  # 32 MiB: numpy advises huge pages for arrays of 4 MiB and more
    advised, plain = np.empty(size, np.uint64), plain_empty(size, np.uint64)
    middle = advised.nbytes // 2  # numpy advises the whole pages inside the array, so look inside
    if "hg" not in vm_flags(advised.ctypes.data + middle):
        pytest.skip("numpy gives no huge-page advice here (NUMPY_MADVISE_HUGEPAGE=0 or an old kernel)")
    assert "hg" not in vm_flags(plain.ctypes.data + middle)


@pytest.mark.parametrize("dtype, length", [(np.int64, 0), (np.int32, 1), (np.uint8, 4097), (np.float32, 3 << 20)])
def test_reserve_is_like_np_zeros(dtype, length) -> None:
    out = reserve(dtype, length)
    expected = np.zeros(length, dtype)
    assert out.shape == expected.shape and out.dtype == expected.dtype and out.flags.writeable
    assert (out == expected).all()
    out[-1:] = 5
    gc.collect()
    assert (out[-1:] == 5).all() and (out[:-1] == 0).all()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_reserve_costs_memory_only_for_the_pages_written() -> None:
    column = reserve(np.int64, 1 << 28)  # 2 GiB of address space
    # kB resident in the mapping holding it: the kernel may merge it with an anonymous neighbour, so compare growth.
    before = int(mapping_fields(column.ctypes.data)["Rss"][0])
    assert before < 1 << 20  # far from the 2 GiB reserved
    column[: 1 << 17] = 1  # 1 MiB written
    assert 1024 <= int(mapping_fields(column.ctypes.data)["Rss"][0]) - before < 2048 + 4  # at most a huge page more


def numpy_advice_on() -> bool:
    switch = memory._ADVICE_SWITCH
    current = switch(False)
    switch(current)
    return current


@pytest.mark.skipif(memory._ADVICE_SWITCH is None, reason="this numpy has no huge-page advice switch")
def test_no_numpy_huge_pages_turns_numpy_advice_off_then_back() -> None:
    before = numpy_advice_on()
    with no_numpy_huge_pages():
        with no_numpy_huge_pages():  # nested: the inner block's end changes nothing
            pass
        assert not numpy_advice_on()
    assert numpy_advice_on() == before


def test_no_numpy_huge_pages_in_overlapping_threads_restores_the_setting(monkeypatch) -> None:
    setting = [True]

    def switch(enabled: bool) -> bool:
        before, setting[0] = setting[0], enabled
        return before

    monkeypatch.setattr(memory, "_ADVICE_SWITCH", switch)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []  # the setting inside the second block after the first one left

    def first() -> None:
        with no_numpy_huge_pages():
            first_in.set()
            second_in.wait()
        first_out.set()

    def second() -> None:
        first_in.wait()
        with no_numpy_huge_pages():
            second_in.set()
            first_out.wait()
            seen.append(setting[0])

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [False]  # the first block's end left the advice off for the second one
    assert setting == [True]  # the last block out restored numpy's own setting
    with pytest.raises(ValueError):  # an error inside still restores it
        with no_numpy_huge_pages():
            raise ValueError("boom")
    assert setting == [True]


BIG = (1 << 20, 1)  # 8 MiB of uint64: above NUMPY_ADVICE_BYTES, so plain_empty maps it


def test_reused_buffers_reuses_a_freed_buffer_and_keeps_none_after() -> None:
    with reused_buffers():
        first = plain_empty(BIG, np.uint64)
        address = first.ctypes.data
        del first
        gc.collect()
        again = plain_empty(BIG, np.uint64)
        assert again.ctypes.data == address  # the freed mapping, its pages already faulted in
        other = plain_empty((BIG[0] * 2, 1), np.uint64)
        assert other.ctypes.data != address
        del again, other
    assert memory._kept == {} and memory._kept_bytes == 0  # unmapped once the last block left
    outside = plain_empty(BIG, np.uint64)
    del outside
    gc.collect()
    assert memory._kept == {}  # outside reused_buffers a freed buffer is unmapped


HOLDERS = {  # what may outlive the array plain_empty returned, referring to its memory
    "slice": lambda whole: whole[5:9],
    "tensor": lambda whole: torch.from_numpy(whole[1:]),
    "memoryview": lambda whole: memoryview(whole).cast("B"),
    "reshaped": lambda whole: whole.reshape(-1),
}


@pytest.mark.parametrize("keep", sorted(HOLDERS))
def test_reused_buffers_never_reuses_a_buffer_something_still_refers_to(keep: str) -> None:
    with reused_buffers():
        whole = plain_empty((BIG[0], 2), np.uint64)
        whole[...] = 7
        held = HOLDERS[keep](whole)
        address = whole.ctypes.data
        del whole
        gc.collect()
        fresh = plain_empty((BIG[0], 2), np.uint64)
        fresh[...] = 9
        assert fresh.ctypes.data != address
        values = np.asarray(held if keep != "memoryview" else np.frombuffer(held, np.uint64))
        assert (values == 7).all()  # what still refers to the old buffer sees its own values
        del held, values
        gc.collect()
        assert plain_empty((BIG[0], 2), np.uint64).ctypes.data == address  # now free: reused


def test_reused_buffers_keeps_at_most_its_limit() -> None:
    with reused_buffers(3 * (8 << 20) + 100):  # rounded to whole pages, still room for 3 buffers only
        arrays = [plain_empty(BIG, np.uint64) for _ in range(5)]
        del arrays
        gc.collect()
        assert memory._kept_bytes == 3 * (8 << 20) and len(memory._kept[8 << 20]) == 3
        with reused_buffers(8 << 20):  # an inner block's limit holds inside it, the outer one's after
            plain_empty((BIG[0] * 2, 1), np.uint64)  # 16 MiB: larger than the inner limit, never kept
            gc.collect()
            assert 16 << 20 not in memory._kept
        assert memory._kept_limit == 3 * (8 << 20) + memory.PAGE
    assert memory._kept == {}


def test_reused_buffers_keeps_the_size_freed_last() -> None:
    # A stream of equal blocks with an odd-sized one among them: the odd one must not hold the room the stream reuses.
    with reused_buffers(16 << 20):
        odd = plain_empty((BIG[0] + 512, 1), np.uint64)  # 8 MiB + 4 KiB
        del odd
        gc.collect()
        block = plain_empty((BIG[0] * 2, 1), np.uint64)  # 16 MiB: the odd buffer is dropped to keep it
        address = block.ctypes.data
        del block
        gc.collect()
        assert list(memory._kept) == [16 << 20] and memory._kept_bytes == 16 << 20
        assert plain_empty((BIG[0] * 2, 1), np.uint64).ctypes.data == address
    assert memory._kept == {}


def test_kept_buffers_carry_freed_buffers_from_one_block_to_the_next_within_their_limit() -> None:
    kept = KeptBuffers()
    with reused_buffers(keep=kept):
        first = plain_empty(BIG, np.uint64)
        address = first.ctypes.data
        del first
        gc.collect()
    assert memory._kept == {} and kept.nbytes == 8 << 20  # handed to the caller, not unmapped
    with reused_buffers(keep=kept):
        assert kept.nbytes == 0  # lent to the block
        again = plain_empty(BIG, np.uint64)
        assert again.ctypes.data == address  # the block before's memory
        del again
        gc.collect()
    with reused_buffers(4 << 20, keep=kept):  # a block's limit holds for what it takes in
        assert memory._kept == {}
    assert kept.nbytes == 0
    with reused_buffers(keep=kept):
        plain_empty(BIG, np.uint64)
        gc.collect()
    kept.clear()
    assert kept.nbytes == 0 and memory._kept == {}

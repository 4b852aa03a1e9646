"""Stateful property test: HostStore over DiskStore (tiny budgets, tiny segments) against a dict model.

Any sequence of put/get/pop/remove must behave like a dict of exact row bytes, whatever the budget forces (spills,
promotions, straight-to-disk rows, compactions); without a disk store, a put beyond the budget must raise and
change nothing.
"""

import shutil
import tempfile

import pytest
import torch
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from torchrec_ascend.errors import StorageError
from torchrec_ascend.kernels.key_value.disk_record import RecordFormat
from torchrec_ascend.kernels.key_value.disk_store import DiskStore
from torchrec_ascend.kernels.key_value.host_store import HostStore

WIDTH = 3
POOL_KEYS = [0, 1, 2, 3, 4, 5, 6, 7, 2**33 + 1, 2**63 - 1]
POOL = st.sampled_from(POOL_KEYS)
KEYS = st.lists(POOL, max_size=6)
FEW_KEYS = st.lists(POOL, max_size=2)  # pops and removes take fewer keys, so the tiers fill up


def random_rows(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (n, WIDTH), generator=g, dtype=torch.int64)
    return bits.to(torch.int32).view(torch.float32)


def row_bytes(row: torch.Tensor) -> bytes:
    return row.contiguous().view(torch.uint8).numpy().tobytes()


class TieredStoreMachine(RuleBasedStateMachine):
    @initialize(
        budget=st.sampled_from([0, 80, 200, 200, 4096]),  # host capacity 0, 1, 4 or every key: one-pass put and pop
        with_disk=st.sampled_from([True, True, True, False]),
        promote=st.booleans(),
        headroom=st.sampled_from([0.0, 0.5]),
        prefill=st.lists(POOL, max_size=10),
    )
    def open_stores(self, budget, with_disk, promote, headroom, prefill):
        self.directory = tempfile.mkdtemp()
        record = RecordFormat(WIDTH, torch.float32).nbytes
        disk = DiskStore(self.directory, WIDTH, name="t", segment_bytes=3 * record) if with_disk else None
        self.store = HostStore(
            WIDTH, budget_bytes=budget, spill=disk, name="t", promote=promote, spill_headroom=headroom, initial_rows=1
        )
        self.model = {}
        self.version = 0
        self.put(prefill)  # start from a full store more often: spills and promotions need one

    @rule(keys=KEYS)
    def put(self, keys):
        self.version += 1
        rows = random_rows(len(keys), self.version)
        new = {k for k in keys if k not in self.model}
        if self.store.spill is None and len(self.model) + len(new) > self.store.max_rows:
            with pytest.raises(StorageError, match="budget"):
                self.store.put(torch.tensor(keys, dtype=torch.int64), rows)
            return
        self.store.put(torch.tensor(keys, dtype=torch.int64), rows)
        self.model.update((k, row_bytes(rows[i])) for i, k in enumerate(keys))

    def check_rows(self, keys, rows, found):
        for i, k in enumerate(keys):
            assert bool(found[i]) == (k in self.model)
            assert row_bytes(rows[i]) == self.model.get(k, bytes(4 * WIDTH))

    @rule(keys=KEYS)
    def get(self, keys):
        rows, found = self.store.get(torch.tensor(keys, dtype=torch.int64))
        self.check_rows(keys, rows, found)

    @rule(keys=FEW_KEYS)
    def pop(self, keys):
        rows, found = self.store.pop(torch.tensor(keys, dtype=torch.int64))
        self.check_rows(keys, rows, found)
        for k in keys:
            self.model.pop(k, None)

    @rule(keys=FEW_KEYS)
    def remove(self, keys):
        self.store.remove(torch.tensor(keys, dtype=torch.int64))
        for k in keys:
            self.model.pop(k, None)

    @precondition(lambda self: hasattr(self, "store"))
    @invariant()
    def tiers_hold_the_model_within_budget(self):
        stats = self.store.stats()
        assert len(self.store) == len(self.model) == stats["host_rows"] + stats["disk_rows"]
        assert self.store.nbytes <= self.store.budget_bytes
        assert stats["host_rows"] <= self.store.max_rows

    @precondition(lambda self: hasattr(self, "store"))
    @invariant()
    def every_key_reads_back(self):
        # A get of the whole pool after every step (hypothesis runs often disable the get rule): with
        # promote=True it also moves disk rows up, spilling others.
        keys = POOL_KEYS + [99]
        rows, found = self.store.get(torch.tensor(keys, dtype=torch.int64))
        self.check_rows(keys, rows, found)

    @precondition(lambda self: hasattr(self, "store"))
    @invariant()
    def chunks_list_the_model(self):
        listed = {}
        for keys, rows in self.store.chunks(rows_per_chunk=4):
            for i, k in enumerate(keys.tolist()):
                assert k not in listed
                listed[k] = row_bytes(rows[i])
        assert listed == self.model
        assert [k for keys in self.store.keys(rows_per_chunk=4) for k in keys.tolist()] == list(listed), (
            "keys() lists the keys of chunks(), in its order"
        )

    def teardown(self):
        if hasattr(self, "store"):
            stats = self.store.stats()  # shown by --hypothesis-show-statistics: what the runs covered
            for counter in ("spilled_rows", "promoted_rows", "direct_disk_rows"):
                event(f"{counter} > 0: {stats[counter] > 0}")
            if self.store.spill is not None:
                event(f"compactions > 0: {self.store.spill.stats()['compactions'] > 0}")
            self.store.close()
            shutil.rmtree(self.directory, ignore_errors=True)


TieredStoreMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
test_tiered_store_matches_a_dict = TieredStoreMachine.TestCase

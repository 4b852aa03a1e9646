"""Unsharded hash tables (torchrec_ascend.hash.modules) on the emulated NPU.

Oracle: the same stock EmbeddingBagCollection of hash configs on the CPU (rows are initialised from (seed, ID,
column), so both start equal) and exact copy counts derived from what one lookup moves. The ID map and the policies
are host work: a lookup's IDs cross to the host once and its rows come back once; the slot table stays on the host
when the collection moves to the device.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

import pytest

from fresh_interpreter import run_python

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def facts() -> Dict[str, Any]:
    paths = os.pathsep.join([str(HERE.parent / "foundation"), str(HERE)])
    return run_python("from emulator_probe import main; main('hash_modules')", env={"PYTHONPATH": paths}, timeout=300)


def test_collection_on_the_device_keeps_its_slot_table_on_the_host(facts: Dict[str, Any]) -> None:
    assert facts["weight_device"] == ["npu:0", "npu:0"]
    assert facts["slot_table_device"] == ["cpu", "cpu"]
    assert facts["state_dict_keys"] is True


def test_training_and_eval_match_the_cpu_collection(facts: Dict[str, Any]) -> None:
    assert facts["train"] == [["npu:0", True], ["npu:0", True]]
    assert facts["grads"] == [True, True]
    assert facts["eval_unknown"] is True


def test_one_lookup_moves_ids_to_the_host_once_and_rows_back_once(facts: Dict[str, Any]) -> None:
    # Known IDs: 3 IDs down (24 bytes), their 3 rows up; the blocking D2H copy is the one host sync.
    assert facts["lookup_known"] == {"h2d": 1, "h2d_bytes": 24, "d2h": 1, "d2h_bytes": 24, "d2d": 0, "syncs": 1}
    # Two new IDs add their rows' slots (16 bytes) and initial values (2 x 4 float32 = 32 bytes), one copy each.
    assert facts["lookup_new"] == {"h2d": 3, "h2d_bytes": 72, "d2h": 1, "d2h_bytes": 24, "d2d": 0, "syncs": 1}


def test_bad_device_batches_raise_the_documented_errors(facts: Dict[str, Any]) -> None:
    assert facts["negative"].startswith("InputError: hash table 'item', feature 'i': IDs must be non-negative int64")
    assert facts["full"].startswith("CapacityError: hash table 'item' is full")

"""data_parallel hash tables (kernels/dense.py, HashDenseRows.map_replicated) on 2 emulated-npu ranks whose process
group has no host backend (``init_process_group("hccl")``, as on an Ascend host).

The replicas all-gather the batch's IDs on the device (the host all-gather failed there with "No backend type
associated with device type cpu"). Invariants: every replica gives each ID the same row (equal ID maps on both ranks,
equal embeddings for the IDs both ranks looked up), results on the device, and the copies of one training step.
The conformance hash_tables check compares these tables with the unsharded module and a plain-Python model.
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
    return run_python("from emulator_probe import main; main('hash_data_parallel')", env={"PYTHONPATH": paths},
                      timeout=300)


@pytest.mark.parametrize("kind", ["ebc", "ec"])
def test_replicas_map_ids_alike_over_a_device_only_group(facts: Dict[str, Any], kind: str) -> None:
    ranks = facts["ranks"]
    assert facts["exit"] == [0, 0]
    zero, one = (ranks[r][kind] for r in ("0", "1"))
    assert zero["error"] == one["error"] == ""
    assert zero["device"] == "npu:0" and one["device"] == "npu:1"
    assert zero["id_maps"] == one["id_maps"] and zero["id_maps"]


def test_shared_ids_read_the_same_rows_on_every_replica(facts: Dict[str, Any]) -> None:
    """EC rows are per ID: rank 0 looked up [7, 3, 11 | 5] and rank 1 [3, 7, 13 | 5] (features f | g)."""
    zero, one = (facts["ranks"][r]["ec"]["rows"] for r in ("0", "1"))
    assert zero[0] == one[1] and zero[1] == one[0]  # IDs 7 and 3
    assert zero[3] == one[3]  # ID 5


@pytest.mark.parametrize("kind", ["ebc", "ec"])
def test_a_step_copies_lengths_and_ids_down_once_and_rows_up_once(facts: Dict[str, Any], kind: str) -> None:
    """The measured step repeats the first step's IDs (no new rows): one all-gather of lengths and IDs comes down in
    one copy (the host was a sync point anyway), the rows go up in one."""
    for rank in ("0", "1"):
        counts = facts["ranks"][rank][kind]["counts"]
        assert (counts["d2h"], counts["syncs"], counts["h2d"]) == (1, 1, 1), counts


@pytest.mark.parametrize("kind", ["ebc", "ec"])
def test_a_batch_over_the_gather_width_widens_it_on_every_rank(facts: Dict[str, Any], kind: str) -> None:
    """301 IDs on each rank, over the first width (256): the IDs are gathered once more (a second copy down), every
    rank takes the same wider width (twice the batch, a power of two), and the replicas still agree (the ID maps are
    read after this step)."""
    zero, one = (facts["ranks"][r][kind] for r in ("0", "1"))
    assert zero["widths"] == one["widths"] == [1024]
    assert zero["widening"]["d2h"] > zero["counts"]["d2h"]
    assert zero["id_maps"] == one["id_maps"]

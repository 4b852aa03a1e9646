"""Checkpoints across world sizes: saved by 2 ranks (a full save and two increments), loaded by 4 ranks and by 1 in
other layouts and kernels; every row is restored and training continues like the model that never stopped.

Two launches of ``conformance_tests/plugin/checkpoint.py``: 2 ranks save, then 4 ranks load; the 1-rank loads run
in that launch on a one-rank process group (a launch costs seconds; a model sharded over that group sees a world of
one, like a one-process job). The script's ``check_result`` is the oracle: rows right after loading equal the saved
ones exactly, and outputs and final rows while training on match the model that never stopped (bit for bit with the
layout unchanged, within float summation order otherwise).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from torchrec_ascend.conformance_tests.launch import run_distributed
from torchrec_ascend.conformance_tests.plugin import checkpoint

pytestmark = pytest.mark.multiprocess
SCRIPT = Path(checkpoint.__file__)

SAVES = {  # saved by 2 ranks: name -> (kind, sharding type, kernel of the hash tables, optimizer)
    "ebc_rw_fused": ("ebc", "row_wise", "fused", "adagrad"),
    "ebc_rw_kv": ("ebc", "row_wise", "key_value", "rowwise_adagrad"),
    "ec_cw_fused": ("ec", "column_wise", "fused", "sgd"),
}
LOADS = {  # world size -> (save, sharding type, kernel) loaded into
    1: [("ebc_rw_fused", "table_wise", "fused"), ("ebc_rw_kv", "table_wise", "key_value"),
        ("ec_cw_fused", "table_wise", "key_value")],
    4: [("ebc_rw_fused", "row_wise", "key_value"), ("ebc_rw_fused", "column_wise", "fused"),
        ("ebc_rw_kv", "row_wise", "fused"), ("ec_cw_fused", "column_wise", "fused")],
}
ROUND_TRIPS = [  # on 2 ranks, layout unchanged: bit for bit, policy state and counters included
    ("ebc", "row_wise", "key_value", "adagrad", "default"),
    ("ebc", "row_wise", "fused", "rowwise_adagrad", "evict"),
]


def load_id(world: int, load: Any) -> str:
    return f"{world}-{'-'.join(load)}"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    root = tmp_path_factory.mktemp("checkpoints")
    cases: List[Dict[str, Any]] = [
        {"action": "save", "dir": str(root / name), "kind": kind, "sharding_type": st, "kernel": kernel,
         "optimizer": optimizer, "policy": "default"}
        for name, (kind, st, kernel, optimizer) in SAVES.items()
    ]
    for name in SAVES:
        (root / name).mkdir()
    cases += [checkpoint.round_trip_case(kind, st, kernel, opt, policy, st, kernel, 2)
              for kind, st, kernel, opt, policy in ROUND_TRIPS]
    cases.append({"action": "dense"})
    results = run_distributed(SCRIPT, world_size=2, cases=cases, timeout=600)["results"]
    return {"root": root, "saves": dict(zip(SAVES, results)), "round_trips": results[len(SAVES):-1],
            "dense": results[-1]}


@pytest.fixture(scope="module")
def loaded(saved: Dict[str, Any]) -> Dict[str, Any]:
    loads = [(world, load) for world, world_loads in LOADS.items() for load in world_loads]
    cases = [{"action": "load", "dir": str(saved["root"] / name), "sharding_type": st, "kernel": kernel,
              "world_size": world} for world, (name, st, kernel) in loads]
    results = run_distributed(SCRIPT, world_size=max(LOADS), cases=cases, timeout=600)["results"]
    return {load_id(world, load): r for (world, load), r in zip(loads, results)}


@pytest.mark.parametrize("name", list(SAVES))
def test_saved_a_full_checkpoint_and_two_increments(saved: Dict[str, Any], name: str) -> None:
    result = saved["saves"][name]
    checkpoint.check_result(result)
    assert result["save_kinds"] == ["full", "incremental", "incremental"]


@pytest.mark.parametrize("case", ROUND_TRIPS, ids=lambda c: "-".join(c))
def test_unchanged_layout_continues_bit_for_bit(saved: Dict[str, Any], case: Any) -> None:
    result = saved["round_trips"][ROUND_TRIPS.index(case)]
    checkpoint.check_result(result)
    assert result["same_layout"] and result["exact"] and result["chain"] == [1, 2, 3]


@pytest.mark.parametrize("world,load", [(w, load) for w, loads in LOADS.items() for load in loads],
                         ids=[load_id(w, load) for w, loads in LOADS.items() for load in loads])
def test_loaded_at_another_world_size(loaded: Dict[str, Any], saved: Dict[str, Any], world: int, load: Any) -> None:
    result = loaded[load_id(world, load)]
    checkpoint.check_result(result)
    assert result["ids"] == saved["saves"][load[0]]["saved_ids"], "every saved ID is restored exactly once"
    assert result["chain"] == [1, 2, 3], "the load replays the full save and both increments"


def test_saver_and_dcp_together_restore_the_whole_model(saved: Dict[str, Any]) -> None:
    checkpoint.check_result(saved["dense"])  # hash table by the Saver; dense layer and plain table by DCP

"""Sharded hash tables (2 gloo ranks) equal the unsharded hash module and a plain-Python dict model (<= 1e-6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from torchrec_ascend.conformance_tests.launch import run_distributed
from torchrec_ascend.conformance_tests.plugin import hash_tables

pytestmark = pytest.mark.multiprocess

TYPES = {
    "ebc": ["data_parallel", "row_wise", "table_wise", "column_wise", "table_column_wise"],
    "ec": ["data_parallel", "row_wise", "table_wise", "column_wise"],
}
CASES: List[Dict[str, Any]] = [
    {"kind": kind, "sharding_type": st, "optimizer": opt}
    for kind, types in TYPES.items()
    for st in types
    for opt in ("sgd", "adagrad", "rowwise_adagrad")
] + [  # use_index_dedup, on IDs that would merge if linearized by table size
    {"kind": "ec", "sharding_type": st, "optimizer": "rowwise_adagrad", "dedup": "index_dedup"} for st in TYPES["ec"]
]
TOLERANCE = 1e-6


def case_id(case: Dict[str, Any]) -> str:
    return "-".join(str(case[k]) for k in ("kind", "sharding_type", "optimizer", "dedup") if k in case)


@pytest.fixture(scope="module")
def results() -> Dict[str, Any]:
    run = run_distributed(Path(hash_tables.__file__), world_size=2, cases=CASES)
    return {case_id(r): r for r in run["results"]}


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_sharded_equals_unsharded_and_python(results: Dict[str, Any], case: Dict[str, Any]) -> None:
    r = results[case_id(case)]
    assert not r["error"], r.get("traceback") or r["error"]
    assert r["fwd_err_unsharded"] <= TOLERANCE and r["fwd_err_python"] <= TOLERANCE
    assert r["row_err_unsharded"] <= TOLERANCE and r["row_err_python"] <= TOLERANCE
    assert r["ids"] == r["expected_ids"] > 0, "every ID seen should own exactly one row across the shards"
    assert r["index_dedup"] == ("dedup" in case), "the sharded module must dedup exactly when asked"

"""Hash tables fed int32 IDs, per-sample weights or MEAN pooling, sharded over 2 gloo ranks (FUSED and KEY_VALUE),
equal the unsharded hash collection trained on the global batch (see ``hash_inputs.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from torchrec_ascend.conformance_tests.launch import run_distributed

pytestmark = pytest.mark.multiprocess

CASES: List[Dict[str, Any]] = [
    {"kernel": k, "sharding_type": t, "input": i}
    for i in ("int32", "weighted", "mean")
    for k in ("fused", "key_value")
    for t in ("row_wise", "table_wise")
]
TOLERANCE = 1e-6


def case_id(case: Dict[str, Any]) -> str:
    return "-".join(str(case[k]) for k in ("input", "kernel", "sharding_type"))


@pytest.fixture(scope="module")
def results() -> Dict[str, Any]:
    run = run_distributed(Path(__file__).with_name("hash_inputs.py"), world_size=2, cases=CASES)
    return {case_id(r): r for r in run["results"]}


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_sharded_hash_tables_equal_the_unsharded_collection(results: Dict[str, Any], case: Dict[str, Any]) -> None:
    r = results[case_id(case)]
    assert not r["error"], r.get("traceback") or r["error"]
    assert r["fwd_err"] <= TOLERANCE and r["row_err"] <= TOLERANCE

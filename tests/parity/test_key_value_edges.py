"""KEY_VALUE at its edges (2 gloo ranks, bit for bit against FUSED holding every ID): a cache of the whole shard
(``load_factor=1.0``) and evaluation batches many times the cache right after training (see ``kv_edges.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from torchrec_ascend.conformance_tests.launch import run_distributed

pytestmark = pytest.mark.multiprocess

FULL = [{"kind": "full_cache", "module": m} for m in ("ebc", "ec")] + [
    {"kind": "full_cache", "module": "ebc", "weighted": True}
]
EVAL: List[Dict[str, Any]] = [
    {"kind": "eval", "module": "ebc", "pooling": p, "weighted": w} for p in ("sum", "mean") for w in (False, True)
] + [{"kind": "eval", "module": "ec"}] + [
    {"kind": "eval", "module": "ebc", "pooling": p, "weighted": w, "vbe": True}
    for p, w in (("sum", True), ("mean", False))
]


def case_id(case: Dict[str, Any]) -> str:
    return "-".join(str(case.get(k, "")) for k in ("kind", "module", "pooling", "weighted", "vbe"))


@pytest.fixture(scope="module")
def results() -> Dict[str, Any]:
    run = run_distributed(Path(__file__).with_name("kv_edges.py"), world_size=2, cases=FULL + EVAL)
    return {case_id(r): r for r in run["results"]}


@pytest.mark.parametrize("case", FULL, ids=case_id)
def test_a_cache_of_the_whole_shard_trains_as_fused(results: Dict[str, Any], case: Dict[str, Any]) -> None:
    r = results[case_id(case)]
    assert not r["error"], r.get("traceback") or r["error"]
    assert r["fwd_err"] == 0.0 and r["eval_err"] == 0.0 and r["row_err"] == 0.0, "not bit for bit"
    assert r["evicted"] == 0, "a cache of the whole shard must never evict"


@pytest.mark.parametrize("case", EVAL, ids=case_id)
def test_eval_batches_larger_than_the_cache_read_every_tier(results: Dict[str, Any], case: Dict[str, Any]) -> None:
    r = results[case_id(case)]
    assert not r["error"], r.get("traceback") or r["error"]
    assert r["fwd_err"] == 0.0 and r["row_err"] == 0.0, "training is not bit for bit"
    assert r["eval_err"] <= 1e-6, "evaluation differs from FUSED"
    assert r["eval_rows"] > 8 and r["evicted"] > 0, "the eval batch fit the cache: the case proves nothing"

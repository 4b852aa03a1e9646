"""The conformance KEY_VALUE script's parity variants that needed kernel fixes, in the test suite (CI runs the
conformance suite quick, without them): FP16 tables (rows written in the table's dtype, the stock state_dict's
placeholder in it too) and a variable batch over a lookup of two kernels (TorchRec preallocates one output, which
fbgemm's CPU TBE refuses; the kernels place theirs into it), KEY_VALUE bit for bit against FUSED on 2 gloo ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from torchrec_ascend.conformance_tests.launch import run_distributed
from torchrec_ascend.conformance_tests.plugin import key_value

pytestmark = pytest.mark.multiprocess

BASE = {"sharding_type": "row_wise", "optimizer": "rowwise_adagrad", "steps": 30, "cache_rows": 64, "host_kb": 8}
CASES: List[Dict[str, Any]] = [{"kind": "ebc", **BASE, "variant": "fp16"}, {"kind": "ec", **BASE, "variant": "fp16"},
                               {"kind": "ebc", **BASE, "variant": "vbe"}]


def case_id(case: Dict[str, Any]) -> str:
    return f"{case['kind']}-{case['variant']}"


@pytest.fixture(scope="module")
def results() -> Dict[str, Any]:
    run = run_distributed(Path(key_value.__file__), world_size=2, cases=CASES)
    return {case_id(r): r for r in run["results"]}


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_key_value_variant_trains_as_fused(results: Dict[str, Any], case: Dict[str, Any]) -> None:
    r = results[case_id(case)]
    assert not r["error"], r.get("traceback") or r["error"]
    assert r["fwd_err"] == 0.0 and r["row_err"] == 0.0, "not bit for bit"
    assert r["evicted"] > 0 and r["swapped_in"] > 0, "the cache never swapped: the case proves nothing"

"""Stock TorchRec scripts (never importing torchrec_ascend) on 2 gloo ranks equal the unsharded reference.

The plugin is active only through torch's entry point; with ``TORCHREC_ASCEND_AUTOLOAD=0`` the same script is
refused row-wise sharding on CPU, which proves the plugin is what enables it. Besides every sharding type x
optimizer: variable and empty per-rank batches, TorchRec's VBE, mean pooling, per-sample weights, mixed dims, FP16
tables, int32 indices, eval mode, every stock train pipeline (FUSED and KEY_VALUE tables) and ``DMP.copy()``.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch

from torchrec_ascend.conformance_tests.launch import STOCK_SCRIPTS, run_distributed

pytestmark = pytest.mark.multiprocess

EBC_TYPES = [
    "data_parallel", "table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise", "grid_shard",
]
EC_TYPES = ["data_parallel", "table_wise", "column_wise", "row_wise"]
OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad"]
SPLIT_TYPES = {"column_wise", "table_column_wise", "row_wise", "table_row_wise", "grid_shard"}
# One setting at a time, on the sharding types it touches (fbgemm's VBE takes row-wise Adagrad, not Adagrad).
VARIANTS: Dict[str, Dict[str, Any]] = {
    "variable": {"batch": "variable", "ebc": ["table_wise", "row_wise", "table_row_wise", "column_wise"],
                 "ec": ["table_wise", "row_wise"]},
    "empty": {"batch": "empty", "ebc": ["table_wise", "row_wise", "table_row_wise"], "ec": ["table_wise", "row_wise"]},
    "vbe": {"batch": "vbe", "optimizer": "rowwise_adagrad", "ebc": ["table_wise", "row_wise", "table_row_wise"]},
    "mean": {"pooling": "mean", "ebc": ["table_wise", "row_wise", "table_row_wise", "column_wise"]},
    "weighted": {"weighted": True, "ebc": ["table_wise", "row_wise", "table_row_wise"]},
    "mixed": {"dims": "mixed", "ebc": ["table_wise", "row_wise", "table_row_wise", "column_wise"]},
    "fp16": {"dtype": "fp16", "ebc": ["table_wise", "row_wise"]},
    "int32": {"index": "int32", "ebc": ["table_wise", "row_wise", "table_row_wise"], "ec": ["row_wise"]},
    "eval": {"eval": True, "ebc": ["row_wise", "table_row_wise"], "ec": ["row_wise"]},
}
VARIANT_CASES: List[Dict[str, Any]] = [
    {"kind": kind, "sharding_type": t, "optimizer": v.get("optimizer", "adagrad"),
     **{k: x for k, x in v.items() if k not in ("ebc", "ec", "optimizer")}}
    for v in VARIANTS.values() for kind in ("ebc", "ec") for t in v.get(kind, [])
]
PIPELINES = [("sparse_dist", "fused"), ("sparse_dist", "key_value"), ("prefetch", "fused"), ("prefetch", "key_value"),
             ("eval", "fused"), ("eval", "key_value")]
SEMI_SYNC = {"kind": "pipeline", "pipeline": "semi_sync", "kernel": "fused"}
PIPELINE_CASES = [{"kind": "pipeline", "pipeline": p, "kernel": k} for p, k in PIPELINES]
CASES: List[Dict[str, Any]] = (
    [{"kind": "ebc", "sharding_type": t, "optimizer": o} for t in EBC_TYPES for o in OPTIMIZERS]
    + [{"kind": "ec", "sharding_type": t, "optimizer": o} for t in EC_TYPES for o in OPTIMIZERS]
    + VARIANT_CASES + PIPELINE_CASES + [{"kind": "copy"}]
)
REFUSED = [SEMI_SYNC]
TOLERANCE = 1e-5
# FP16 tables: fbgemm updates fp16 rows (with stochastic rounding) while the reference keeps fp32 rows, so they
# part by fp16 rounding steps (2**-11 relative); a wrong update or lookup is off by far more.
FP16_TOLERANCE = 2e-3


def case_id(case: Dict[str, Any]) -> str:
    keys = ("kind", "sharding_type", "optimizer", "batch", "pooling", "weighted", "dims", "dtype", "index", "eval",
            "pipeline", "kernel")
    return "-".join(str(case[k]) for k in keys if k in case)


@pytest.fixture(scope="module")
def matrix() -> Dict[str, Any]:
    run = run_distributed(STOCK_SCRIPTS / "sharding_matrix.py", world_size=2, cases=CASES + REFUSED)
    return {"info": run["info"], "results": {case_id(r): r for r in run["results"]}}


@pytest.fixture(scope="module")
def opted_out() -> Dict[str, Any]:
    cases = [{"kind": "ebc", "sharding_type": "row_wise", "optimizer": "sgd"}, {"kind": "copy"},
             {"kind": "ebc", "sharding_type": "table_wise", "optimizer": "adagrad", "batch": "empty"}]
    return run_distributed(
        STOCK_SCRIPTS / "sharding_matrix.py", world_size=2, cases=cases, env={"TORCHREC_ASCEND_AUTOLOAD": "0"}
    )


def test_plugin_was_loaded_by_the_entry_point_only(matrix: Dict[str, Any]) -> None:
    assert matrix["info"]["plugin_state"] == "active", "torch's entry point should have activated the plugin"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_unsharded_reference(matrix: Dict[str, Any], case: Dict[str, Any]) -> None:
    result = matrix["results"][case_id(case)]
    assert not result["error"], result.get("traceback") or result["error"]
    tolerance = FP16_TOLERANCE if case.get("dtype") == "fp16" else TOLERANCE
    assert result["fwd_err"] <= tolerance
    assert result["weight_err"] <= tolerance
    assert result["moved"] > 1e-3, "the weights did not move: the comparison would prove nothing"
    if case.get("sharding_type") in SPLIT_TYPES:
        assert result["shards"] > 1, "the plan did not split the table: this case would test table_wise"
    if case.get("eval"):
        assert result["eval_err"] is not None and result["eval_err"] <= tolerance
    if case["kind"] == "pipeline":
        assert result["steps"] == 6, "every batch must come out of the pipeline"


def test_semi_sync_pipeline_is_refused_on_the_cpu_with_its_alternatives(matrix: Dict[str, Any]) -> None:
    error = matrix["results"][case_id(SEMI_SYNC)]["error"]
    assert "TrainPipelineSemiSync is not supported on cpu" in error and "TrainPipelineSparseDist" in error, error


def test_row_wise_is_refused_without_the_plugin(opted_out: Dict[str, Any]) -> None:
    assert opted_out["info"]["plugin_state"] == "disabled"
    row_wise, copy, empty = opted_out["results"]
    assert "No available sharding type" in row_wise["error"]
    assert not empty["error"], "table_wise needs nothing of the plugin, even with an empty rank batch"
    # Stock copy() deep-copies the gloo group: a CPU-only torch fails naming ProcessGroupNCCL, a CUDA build pickling it.
    nccl_build = hasattr(torch._C._distributed_c10d, "ProcessGroupNCCL")
    expected = "cannot pickle 'torch._C._distributed_c10d.ProcessGroup'" if nccl_build else "ProcessGroupNCCL"
    assert expected in copy["error"], "stock DMP.copy() fails without the plugin"

"""Stock TorchRec scripts (never importing torchrec_ascend) on 2 gloo ranks equal the unsharded reference.

The plugin is active only through torch's entry point; with ``TORCHREC_ASCEND_AUTOLOAD=0`` the same script is
refused row-wise sharding on CPU, which proves the plugin is what enables it.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch

from torchrec_ascend.conformance_tests.launch import STOCK_SCRIPTS, run_distributed

pytestmark = pytest.mark.multiprocess

EBC_TYPES = ["data_parallel", "table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise", "grid_shard"]
EC_TYPES = ["data_parallel", "table_wise", "column_wise", "row_wise"]
OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad"]
SPLIT_TYPES = {"column_wise", "table_column_wise", "row_wise", "table_row_wise", "grid_shard"}
CASES: List[Dict[str, Any]] = (
    [{"kind": "ebc", "sharding_type": t, "optimizer": o} for t in EBC_TYPES for o in OPTIMIZERS]
    + [{"kind": "ec", "sharding_type": t, "optimizer": o} for t in EC_TYPES for o in OPTIMIZERS]
    + [{"kind": "pipeline"}, {"kind": "copy"}]
)
TOLERANCE = 1e-5


def case_id(case: Dict[str, Any]) -> str:
    return "-".join(str(case[k]) for k in ("kind", "sharding_type", "optimizer") if k in case)


@pytest.fixture(scope="module")
def matrix() -> Dict[str, Any]:
    run = run_distributed(STOCK_SCRIPTS / "sharding_matrix.py", world_size=2, cases=CASES)
    return {"info": run["info"], "results": {case_id(r): r for r in run["results"]}}


@pytest.fixture(scope="module")
def opted_out() -> Dict[str, Any]:
    cases = [{"kind": "ebc", "sharding_type": "row_wise", "optimizer": "sgd"}, {"kind": "copy"}]
    return run_distributed(
        STOCK_SCRIPTS / "sharding_matrix.py", world_size=2, cases=cases, env={"TORCHREC_ASCEND_AUTOLOAD": "0"}
    )


def test_plugin_was_loaded_by_the_entry_point_only(matrix: Dict[str, Any]) -> None:
    assert matrix["info"]["plugin_state"] == "active", "torch's entry point should have activated the plugin"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_unsharded_reference(matrix: Dict[str, Any], case: Dict[str, Any]) -> None:
    result = matrix["results"][case_id(case)]
    assert not result["error"], result.get("traceback") or result["error"]
    assert result["fwd_err"] <= TOLERANCE
    assert result["weight_err"] <= TOLERANCE
    assert result["moved"] > 1e-3, "the weights did not move: the comparison would prove nothing"
    if case.get("sharding_type") in SPLIT_TYPES:
        assert result["shards"] > 1, "the plan did not split the table: this case would test table_wise"


def test_row_wise_is_refused_without_the_plugin(opted_out: Dict[str, Any]) -> None:
    assert opted_out["info"]["plugin_state"] == "disabled"
    row_wise, copy = opted_out["results"]
    assert "No available sharding type" in row_wise["error"]
    # Stock copy() deep-copies the gloo group: a CPU-only torch fails naming ProcessGroupNCCL, a CUDA build pickling it.
    nccl_build = hasattr(torch._C._distributed_c10d, "ProcessGroupNCCL")
    expected = "cannot pickle 'torch._C._distributed_c10d.ProcessGroup'" if nccl_build else "ProcessGroupNCCL"
    assert expected in copy["error"], "stock DMP.copy() fails without the plugin"

"""HybridTrainPipelineSparseDist on 2 gloo ranks equals a plain training loop; ends, failures and detach behave.

One launch runs every case (conformance_tests/pipeline/hybrid_pipeline.py); the oracle is the plain loop on the
same DMP construction, initial weights and batches, compared shard by shard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from torchrec_ascend.conformance_tests import launch

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(launch.__file__).parent / "pipeline" / "hybrid_pipeline.py"
TOLERANCE = 1e-6
DEPTHS = [1, 3, 6, 12]
MODELS = [("ebc", "row_wise"), ("ebc", "table_wise"), ("ec", "row_wise"), ("ec", "table_wise"), ("both", "row_wise")]
BATCHES = 14  # more than the deepest pipeline

EQUIVALENCE = [
    {"kind": "equivalence", "model": m, "sharding_type": s, "depth": d, "batches": BATCHES, "host_threads": 2}
    for m, s in MODELS
    for d in DEPTHS
] + [  # TorchRec's index dedup in the input dist, behind the pipeline
    {"kind": "equivalence", "model": "ec", "sharding_type": s, "depth": 3, "batches": BATCHES, "host_threads": 2,
     "dedup": "index_dedup"}
    for s in ("row_wise", "table_wise")
]
# (batches, depth, execute_all_batches) -> batches trained (stock semantics for False: depth - 1 are not trained)
END_OF_DATA = {(0, 6, True): 0, (3, 6, True): 3, (6, 6, True): 6, (7, 6, True): 7, (7, 3, False): 5, (4, 1, False): 4}
RAISES = [
    {"where": "load", "at": 4, "depth": 3, "stage": "LOAD"},
    {"where": "load", "at": 0, "depth": 3, "stage": "LOAD"},
    {"where": "copy", "at": 2, "depth": 6, "stage": "COPY2DEVICE"},
    {"where": "split", "at": 3, "depth": 3, "stage": "SPLIT"},
    {"where": "split", "at": 0, "depth": 3, "stage": "SPLIT"},  # while the model is being rewritten
    {"where": "prefetch", "at": 0, "depth": 6, "stage": "POST_INPUT"},
    {"where": "prefetch", "at": 5, "depth": 12, "stage": "POST_INPUT"},
    {"where": "compute", "at": 2, "depth": 3, "stage": "COMPUTE"},
]
CASES: List[Dict[str, Any]] = (
    EQUIVALENCE
    + [{"kind": "end_of_data", "batches": n, "depth": d, "execute_all_batches": e} for n, d, e in END_OF_DATA]
    + [{"kind": "raise", **{k: v for k, v in r.items() if k != "stage"}} for r in RAISES]
    + [{"kind": "detach", "depth": 4, "batches": 10, "detach_at": 5}, {"kind": "collect", "depth": 6}]
)


def case_id(case: Dict[str, Any]) -> str:
    keys = ("kind", "model", "sharding_type", "where", "at", "depth", "batches", "execute_all_batches", "dedup")
    return "-".join(str(case[k]) for k in keys if k in case)


@pytest.fixture(scope="module")
def results() -> Dict[str, Dict[str, Any]]:
    run = launch.run_distributed(SCRIPT, world_size=2, cases=CASES, timeout=240)
    return {case_id(r): r for r in run["results"]}


def result_of(results: Dict[str, Dict[str, Any]], case: Dict[str, Any]) -> Dict[str, Any]:
    result = results[case_id(case)]
    assert not result["error"], result.get("traceback") or result["error"]
    return result


def assert_trained_like_plain_loop(result: Dict[str, Any], steps: int) -> None:
    assert result["steps"] == steps
    assert result["weight_err"] <= TOLERANCE
    assert result["output_err"] <= TOLERANCE
    if steps:
        assert result["moved"] > 1e-3, "the weights did not move: the comparison would prove nothing"
        assert result["input_dists_on_mirrors"], "input dists must issue their all-to-alls on the mirror groups"
    assert result["threads_left"] == 0, "pipeline threads outlived the end of the data"


@pytest.mark.parametrize("case", EQUIVALENCE, ids=case_id)
def test_weights_equal_plain_training_loop(results: Dict[str, Dict[str, Any]], case: Dict[str, Any]) -> None:
    result = result_of(results, case)
    assert_trained_like_plain_loop(result, BATCHES)
    assert result["index_dedup"] == ("dedup" in case)


@pytest.mark.parametrize("shape, trained", END_OF_DATA.items(), ids=lambda x: str(x))
def test_end_of_data(results: Dict[str, Dict[str, Any]], shape: Any, trained: int) -> None:
    batches, depth, execute_all = shape
    case = {"kind": "end_of_data", "batches": batches, "depth": depth, "execute_all_batches": execute_all}
    assert_trained_like_plain_loop(result_of(results, case), trained)


@pytest.mark.parametrize("spec", RAISES, ids=lambda r: f"{r['where']}-at{r['at']}-depth{r['depth']}")
def test_stage_failure_surfaces_with_batch_index(results: Dict[str, Dict[str, Any]], spec: Dict[str, Any]) -> None:
    case = {"kind": "raise", **{k: v for k, v in spec.items() if k != "stage"}}
    result = result_of(results, case)
    assert result["steps"] == spec["at"], "every batch before the failing one trains"
    assert (result["stage"], result["batch_index"]) == (spec["stage"], spec["at"])
    assert f"stage {spec['stage']} failed on batch {spec['at']}" in result["message"]
    assert result["cause"] in ("ValueError", "RuntimeError")
    if spec["stage"] != "COMPUTE":  # a compute failure keeps the batches behind it (and their threads)
        assert result["threads_after_error"] == 0, "threads must be joined when a host stage fails"
    assert result["resumed"] > 0, "progress() must work again after the failure"
    assert result["threads_left"] == 0


def test_detach_keeps_batches_and_resumes(results: Dict[str, Dict[str, Any]]) -> None:
    result = result_of(results, {"kind": "detach", "depth": 4, "batches": 10, "detach_at": 5})
    assert result["detached_threads"] == 0, "detach() must join the host threads"
    assert_trained_like_plain_loop(result, 10)


def test_garbage_collection_joins_threads_and_destroys_groups(results: Dict[str, Dict[str, Any]]) -> None:
    result = result_of(results, {"kind": "collect", "depth": 6})
    assert result["running"] >= 4, "the four host lanes run while batches are in flight"
    assert result["mirrors"] == 1 and result["mirror_ranks"] == [[0, 1]]
    assert result["threads_left"] == 0
    assert result["mirrors_left"] == 0

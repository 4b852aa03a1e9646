"""Check: stock TorchRec modules sharded every way the device supports train like the unsharded reference.

Runs ``stock/sharding_matrix.py`` (stock torch and torchrec only: whatever makes it pass was injected through
torch's entry point) for every (EmbeddingBagCollection/EmbeddingCollection, sharding type, fused optimizer) the
device's backend profile lists, plus stock ``TrainPipelineSparseDist`` and ``DistributedModelParallel.copy()``; full
runs add one case per setting of stock modules (per-rank batch sizes, an empty batch, VBE, mean, weighted, mixed dims,
FP16, int32, eval) and stock ``TrainPipelineSparseDist``, ``PrefetchTrainPipelineSparseDist`` and
``EvalPipelineSparseDist`` against a plain loop with FUSED and KEY_VALUE tables (``cases.STOCK_PIPELINES``).
Oracle: the unsharded module trained on the global batch; every step's output and the final weights must agree.
The sharded model and its batches live on the suite's device, and each case reports where its tensors lived. On a
device with streams, a stock pipeline must copy every batch on a stream other than the default one (its own).
"""

from __future__ import annotations

from typing import Any, List

from torchrec_ascend.conformance_tests.cases import Case, sharding_cases
from torchrec_ascend.conformance_tests.config import ScriptRun, SuiteConfig
from torchrec_ascend.conformance_tests.harness import result_of, script_check
from torchrec_ascend.conformance_tests.launch import STOCK_SCRIPTS

SCRIPT = STOCK_SCRIPTS / "sharding_matrix.py"
TOLERANCE = 1e-5
#: FP16 tables: fbgemm updates fp16 rows while the reference keeps fp32 rows rounded to fp16 each step, so they part
#: by fp16 rounding steps (2**-11 relative); a wrong update or lookup is off by far more.
FP16_TOLERANCE = 2e-3
PIPELINE_STEPS = 6  # the batches the script feeds a stock pipeline
MOVED = 1e-3  # the weights must move at least this much, or the comparison proves nothing


def cases_of(suite: SuiteConfig) -> List[Case]:
    """The check's cases on the suite's device (see ``cases.sharding_cases``)."""
    return sharding_cases(suite.profile, suite.world_size, suite.quick)


pytest_generate_tests, matrix = script_check(SCRIPT, cases_of, fixture="matrix")


def test_entry_point_activated_the_plugin(matrix: ScriptRun) -> None:
    assert matrix.info.get("plugin_state") == "active", (
        f"torch's entry point left torchrec-ascend {matrix.info.get('plugin_state')!r} in the ranks; run "
        "`torchrec-ascend doctor` to see why"
    )


def test_case(case: Case, request: Any) -> None:
    result = result_of(request, "matrix", case)
    if case.params["kind"] == "dcp":  # a checkpoint round trip: exact, not within a tolerance
        assert result["weight_err"] == 0.0 and result["state_err"] == 0.0, (
            f"after dcp.load, rows differ from the saved ones by {result['weight_err']} and fused optimizer state by "
            f"{result['state_err']}")
        assert result["fwd_err"] == 0.0, (
            f"training on after the load differs from the saved model by {result['fwd_err']}")
        assert result["moved"] > MOVED, "the fresh model already held the saved rows: the load would prove nothing"
        return
    tolerance = FP16_TOLERANCE if case.params.get("dtype") == "fp16" else TOLERANCE
    assert result["fwd_err"] <= tolerance, f"forward output differs from the unsharded reference by {result['fwd_err']}"
    assert result["weight_err"] <= tolerance, f"weights differ from the unsharded reference by {result['weight_err']}"
    assert result["moved"] > MOVED, "the weights did not move: the comparison would prove nothing"
    if case.params.get("eval"):
        assert result["eval_err"] is not None and result["eval_err"] <= tolerance, (
            f"the eval-mode forward differs from the unsharded reference by {result['eval_err']}")
    if case.params["kind"] == "pipeline" and "pipeline" in case.params:
        assert result["steps"] == PIPELINE_STEPS, f"the pipeline gave {result['steps']} of {PIPELINE_STEPS} batches"
    suite: SuiteConfig = request.getfixturevalue("suite")
    if case.params["kind"] == "pipeline" and suite.profile.streams is not None:
        assert result["side_stream_copies"] == PIPELINE_STEPS, (
            f"the pipeline copied {result['side_stream_copies']} of its {PIPELINE_STEPS} batches to "
            f"{suite.device} on a stream of its own: without streams a pipeline overlaps nothing (torchrec-ascend's "
            "H4 hooks give TorchRec's pipelines the device's streams)")
    min_shards = case.expect.get("min_shards", 1)
    assert (result.get("shards") or 1) >= min_shards, (
        f"the plan made {result.get('shards')} shard(s) of a table, expected at least {min_shards}: this case would "
        "test table_wise"
    )

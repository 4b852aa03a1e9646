"""Check: HybridTrainPipelineSparseDist trains exactly like a plain training loop on the same model.

Runs ``pipeline/hybrid_pipeline.py``: equivalence at several pipeline depths, short data (with and without
``execute_all_batches``), a stage that fails (the error names the stage and batch, and training resumes), and
detach/resume. Oracle: the plain loop on the same DMP construction, initial weights and batches, shard by shard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

from torchrec_ascend.conformance_tests.cases import Case, pipeline_cases
from torchrec_ascend.conformance_tests.config import SuiteConfig
from torchrec_ascend.conformance_tests.harness import result_of, script_check

SCRIPT = Path(__file__).parent / "pipeline" / "hybrid_pipeline.py"
TOLERANCE = 1e-6


def cases_of(suite: SuiteConfig) -> List[Case]:
    """The check's cases on the suite's device (see ``cases.pipeline_cases``)."""
    return pipeline_cases(suite.profile, suite.world_size, suite.quick)


pytest_generate_tests, run = script_check(SCRIPT, cases_of)


def test_case(case: Case, request: Any) -> None:
    r = result_of(request, "run", case, trains=case.params["kind"] != "raise")
    assert r["threads_left"] == 0, "pipeline threads outlived the pipeline"
    if case.params["kind"] == "raise":
        stage, at = case.expect["stage"], case.params["at"]
        assert r["steps"] == at, f"{r['steps']} batches trained before the failing one, expected {at}"
        assert (r["stage"], r["batch_index"]) == (stage, at), f"the error names {r['stage']}/{r['batch_index']}"
        assert f"stage {stage} failed on batch {at}" in r["message"], r["message"]
        assert r["resumed"] > 0, "progress() must train again after the failure"
        return
    assert r["steps"] == case.expect["steps"], f"{r['steps']} batches trained, expected {case.expect['steps']}"
    assert r["weight_err"] <= TOLERANCE, f"weights differ from the plain loop by {r['weight_err']}"
    assert r["output_err"] <= TOLERANCE, f"outputs differ from the plain loop by {r['output_err']}"
    if r["steps"]:
        assert r["moved"] > 1e-3, "the weights did not move: the comparison would prove nothing"
        assert r["input_dists_on_mirrors"], "input dists must issue their all-to-alls on the pipeline's own groups"
    if "detached_threads" in r:
        assert r["detached_threads"] == 0, "detach() must join the host threads"

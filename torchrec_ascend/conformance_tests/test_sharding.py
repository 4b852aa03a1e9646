"""Check: stock TorchRec modules sharded every way the device supports train like the unsharded reference.

Runs ``stock/sharding_matrix.py`` (stock torch and torchrec only: whatever makes it pass was injected through
torch's entry point) for every (EmbeddingBagCollection/EmbeddingCollection, sharding type, fused optimizer) the
device's backend profile lists, plus stock ``TrainPipelineSparseDist`` and ``DistributedModelParallel.copy()``.
Oracle: the unsharded module trained on the global batch; every step's output and the final weights must agree.
The sharded model and its batches live on the suite's device, and each case reports where its tensors lived.
"""

from __future__ import annotations

from typing import Any, List

from torchrec_ascend.conformance_tests.cases import Case, sharding_cases
from torchrec_ascend.conformance_tests.config import ScriptRun, SuiteConfig
from torchrec_ascend.conformance_tests.harness import result_of, script_check
from torchrec_ascend.conformance_tests.launch import STOCK_SCRIPTS

SCRIPT = STOCK_SCRIPTS / "sharding_matrix.py"
TOLERANCE = 1e-5
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
    assert result["fwd_err"] <= TOLERANCE, f"forward output differs from the unsharded reference by {result['fwd_err']}"
    assert result["weight_err"] <= TOLERANCE, f"weights differ from the unsharded reference by {result['weight_err']}"
    assert result["moved"] > MOVED, "the weights did not move: the comparison would prove nothing"
    min_shards = case.expect.get("min_shards", 1)
    assert (result.get("shards") or 1) >= min_shards, (
        f"the plan made {result.get('shards')} shard(s) of a table, expected at least {min_shards}: this case would "
        "test table_wise"
    )

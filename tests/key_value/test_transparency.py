"""KEY_VALUE with a tiny cache (64 rows per shard, 8 KiB of host memory, the rest on disk) trains bit for bit like
FUSED holding every row: every step's output and every final row are exactly equal, unsharded (1 rank) and with
2 ranks, over a thousand steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from torchrec_ascend.conformance_tests.launch import run_distributed
from torchrec_ascend.conformance_tests.plugin import key_value

pytestmark = pytest.mark.multiprocess
SCRIPT = Path(key_value.__file__)
TINY = {"cache_rows": 64, "host_kb": 8}
SHORT: List[Dict[str, Any]] = [
    {"kind": kind, "sharding_type": st, "optimizer": opt, "steps": 30, **TINY}
    for kind, types in {"ebc": ["row_wise", "table_wise", "column_wise"], "ec": ["row_wise", "table_wise"]}.items()
    for st in types
    for opt in ("sgd", "adagrad", "rowwise_adagrad")
]
LONG = {"kind": "ebc", "optimizer": "adagrad", "steps": 1000, **TINY}
# Behind HybridTrainPipelineSparseDist the kernel swaps rows in on a host thread (prefetch), pinning the rows of
# every batch in flight: the cache must hold depth + 1 batches' rows.
PIPELINED: List[Dict[str, Any]] = [
    {"kind": "pipeline", "sharding_type": "row_wise", "optimizer": "rowwise_adagrad", "steps": 60, "depth": 3,
     "cache_rows": 64, "host_kb": 8},
    {"kind": "pipeline", "sharding_type": "table_wise", "optimizer": "adagrad", "steps": 60, "depth": 6,
     "cache_rows": 192, "host_kb": 8},
]
# A cache too small for the batches in flight: a batch that cannot be prefetched, and every one after it until its
# lookup, is mapped at its lookup (in order), still bit for bit.
CONSTRAINED: List[Dict[str, Any]] = [
    {"kind": "pipeline", "sharding_type": "row_wise", "optimizer": "rowwise_adagrad", "steps": 60, "depth": d,
     "cache_rows": rows, "host_kb": 8}
    for d, rows in ((3, 32), (6, 48))
]


def case_id(case: Dict[str, Any]) -> str:
    return (f"{case['kind']}-{case['sharding_type']}-{case['optimizer']}-{case['steps']}-{case.get('depth', 0)}-"
            f"{case['cache_rows']}")


@pytest.fixture(scope="module")
def two_ranks() -> Dict[str, Any]:
    cases = SHORT + PIPELINED + CONSTRAINED + [{**LONG, "sharding_type": "row_wise"}]
    return {case_id(r): r for r in run_distributed(SCRIPT, world_size=2, cases=cases, timeout=600)["results"]}


@pytest.fixture(scope="module")
def one_rank() -> Dict[str, Any]:
    cases = [{**LONG, "sharding_type": "table_wise"}]
    return {case_id(r): r for r in run_distributed(SCRIPT, world_size=1, cases=cases, timeout=600)["results"]}


def check(result: Dict[str, Any]) -> None:
    assert not result["error"], result.get("traceback") or result["error"]
    assert result["fwd_err"] == 0.0 and result["row_err"] == 0.0, "not bit for bit"
    assert result["evicted"] > 0 and result["swapped_in"] > 0, "the cache never swapped: the case proves nothing"


@pytest.mark.parametrize("case", SHORT, ids=case_id)
def test_two_ranks_short(two_ranks: Dict[str, Any], case: Dict[str, Any]) -> None:
    check(two_ranks[case_id(case)])


@pytest.mark.parametrize("case", PIPELINED, ids=case_id)
def test_behind_the_hybrid_pipeline_with_prefetch(two_ranks: Dict[str, Any], case: Dict[str, Any]) -> None:
    result = two_ranks[case_id(case)]
    check(result)  # rows and the dense head equal FUSED trained in a plain loop, bit for bit
    assert result["prefetched"] == result["kernels"] * case["steps"], "every lookup found its rows ready"


@pytest.mark.parametrize("case", CONSTRAINED, ids=case_id)
def test_behind_the_pipeline_with_a_cache_too_small_to_prefetch_every_batch(
    two_ranks: Dict[str, Any], case: Dict[str, Any]
) -> None:
    result = two_ranks[case_id(case)]
    check(result)
    assert 0 < result["prefetched"] < result["kernels"] * case["steps"], "some batches, not all, should be prefetched"


def test_two_ranks_row_wise_a_thousand_steps(two_ranks: Dict[str, Any]) -> None:
    result = two_ranks[case_id({**LONG, "sharding_type": "row_wise"})]
    check(result)
    assert result["disk_rows"] > 0, "the host budget should have spilled rows to disk"


def test_unsharded_a_thousand_steps(one_rank: Dict[str, Any]) -> None:
    result = one_rank[case_id({**LONG, "sharding_type": "table_wise"})]
    check(result)
    assert result["disk_rows"] > 0, "the host budget should have spilled rows to disk"

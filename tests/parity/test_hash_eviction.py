"""Sharded hash tables under eviction, every built-in eviction policy, against plain-Python models of the policy
and of the table (2 gloo ranks, more distinct IDs than rows; see ``hash_eviction.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from torchrec_ascend.conformance_tests.launch import run_distributed

pytestmark = pytest.mark.multiprocess

POLICIES = ["lru", "lfu", "epoch_lru", "epoch_lfu", "ttl", "showclick"]
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def results() -> Dict[str, Any]:
    run = run_distributed(Path(__file__).with_name("hash_eviction.py"), world_size=2,
                          cases=[{"policy": p} for p in POLICIES])
    return {r["policy"]: r for r in run["results"]}


@pytest.mark.parametrize("policy", POLICIES)
def test_evicting_shards_follow_the_policy_and_the_dict_model(results: Dict[str, Any], policy: str) -> None:
    r = results[policy]
    assert not r["error"], r.get("traceback") or r["error"]
    assert r["fwd_err"] <= TOLERANCE and r["row_err"] <= TOLERANCE
    assert r["evicted"] > 20, "the shards should have evicted: the case proves nothing"

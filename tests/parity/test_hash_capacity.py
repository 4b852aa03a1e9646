"""``num_embeddings`` is the number of IDs a hash table holds: row_wise on 2 gloo ranks, against a Python LRU model
(see ``hash_capacity.py``); the unsharded module's case is in ``tests/hash/test_hash_modules.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from torchrec_ascend.conformance_tests.launch import run_distributed

pytestmark = pytest.mark.multiprocess

KINDS = ["ebc", "ec"]


@pytest.fixture(scope="module")
def results() -> Dict[str, Any]:
    run = run_distributed(Path(__file__).with_name("hash_capacity.py"), world_size=2,
                          cases=[{"kind": k} for k in KINDS])
    return {r["kind"]: r for r in run["results"]}


@pytest.mark.parametrize("kind", KINDS)
def test_row_wise_table_holds_num_embeddings_ids(results: Dict[str, Any], kind: str) -> None:
    r = results[kind]
    assert not r["error"], r.get("traceback") or r["error"]
    assert not r["mismatch"], r["mismatch"]
    assert r["fwd_err"] <= 1e-6, "an ID read another row (or the not-admitted vector)"
    assert r["evicted"] == 1 and r["rejected"] == 0 and r["held"] == 8, "8 IDs held; the 9th evicted one"

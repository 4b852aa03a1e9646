"""Check: hash tables sharded every way the device supports train like the unsharded hash module and a dict model.

Runs ``plugin/hash_tables.py``: raw 63-bit IDs with repeats through stock collections of hash table configs, with
the FUSED kernel; also ``use_index_dedup`` and stock ``state_dict()`` round trips. Oracles: the unsharded hash
collection on the global batch, and a plain-Python ``ID -> row`` model with the same deterministic initialisation
and the optimizer written out. The ``reused_row`` cases: an ID that takes over an evicted ID's row (FUSED and
KEY_VALUE; row-wise Adagrad, and in full runs Adam) trains exactly as a brand-new row in plain Python. The
``policy_steps`` cases: a table read by two features takes one policy step per batch (oracle: the batches trained).
The ``cadence`` cases: a pool evicts when, how much and what ``eviction_cadence`` says (oracle: its rules written
out in plain Python, checked batch by batch). The ``admission`` cases: a rejected ID reads ``not_admitted_value`` and
gets no row, an admitted one trains as a new row (oracle: the ``count`` rule and row-wise Adagrad written out in
plain Python, checked batch by batch and on the final rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from torchrec_ascend.conformance_tests.cases import Case, hash_table_cases
from torchrec_ascend.conformance_tests.config import SuiteConfig
from torchrec_ascend.conformance_tests.harness import result_of, script_check

SCRIPT = Path(__file__).parent / "plugin" / "hash_tables.py"
TOLERANCE = 1e-6


def cases_of(suite: SuiteConfig) -> List[Case]:
    """The check's cases on the suite's device (see ``cases.hash_table_cases``)."""
    return hash_table_cases(suite.profile, suite.world_size, suite.quick)


pytest_generate_tests, run = script_check(SCRIPT, cases_of)


def test_case(case: Case, request: Any) -> None:
    r = result_of(request, "run", case)
    if case.params.get("promise") == "reused_row":  # an ID taking over an evicted ID's row trains as a new row
        assert r["full"] and r["reused"] >= r["new_ids"] > 0, (
            f"the shards were not full ({r['full']}) or the new IDs took no evicted rows ({r['reused']} evicted for "
            f"{r['new_ids']} new IDs): the case proves nothing")
        assert r["row_err"] <= TOLERANCE and r["fwd_err"] <= TOLERANCE, (
            f"an ID on a reused row does not train as a new row (fresh initial value, zero optimizer state): its "
            f"outputs differ from the plain-Python oracle by {r['fwd_err']}, its final row by {r['row_err']}")
        return
    if case.params.get("promise") == "policy_steps":  # a table read by two features: one policy step per batch
        wrong = {table: steps for table, steps in r["steps"].items() if set(steps) != {r["batches"]}}
        assert r["steps"] and not wrong, (
            f"after {r['batches']} batches the tables' policies took {wrong} steps (per shard): a table read by "
            "several features must take one step per batch")
        return
    if case.params.get("promise") == "cadence":  # when a pool evicts, how much, which rows it protects
        assert not r["violations"], "eviction_cadence broken: " + "; ".join(r["violations"])
        shown = ("bulk_beyond_need", "expired_beyond_headroom", "forced", "protected")
        assert r["checked"] > 0 and all(r[k] > 0 for k in shown), (
            "the trace did not exercise every cadence rule (each count must be positive): "
            + ", ".join(f"{k}={r[k]}" for k in shown))
        return
    if case.params.get("promise") == "admission":  # a rejected ID reads not_admitted_value and gets no row
        check_admission(r, case.params["kernel"])
        return
    if "state_dict" in case.params:  # state_dict() and the fused optimizer's through DCP, into the same plan
        assert not r["load_error"], r["load_error"]
        assert not r["shape_errors"], f"the not-admitted row shows in the state_dicts: {r['shape_errors']}"
        # into another layout the pooled sums add in another order: within TOLERANCE, else bit for bit
        tolerance = 0.0 if case.params["state_dict"] == case.params["sharding_type"] else TOLERANCE
        assert r["row_err"] <= tolerance and r["fwd_err"] <= tolerance, (
            f"after a state_dict round trip into {case.params['state_dict']} rows differ by {r['row_err']} and "
            f"outputs by {r['fwd_err']} from the model that never stopped (tolerance {tolerance})")
        return
    for oracle in ("unsharded", "python"):
        fwd, rows = r[f"fwd_err_{oracle}"], r[f"row_err_{oracle}"]
        assert fwd <= TOLERANCE, f"forward output differs from the {oracle} oracle by {fwd}"
        assert rows <= TOLERANCE, f"final rows differ from the {oracle} oracle by {rows}"
    assert r["ids"] == r["expected_ids"] > 0, (
        f"{r['ids']} IDs own rows across the shards, {r['expected_ids']} were seen: every ID must own exactly one row"
    )
    assert r["index_dedup"] == ("dedup" in case.params), "the sharded module must dedup exactly when the case asks"


def check_admission(r: Dict[str, Any], kernel: str) -> None:
    """The admission case's result (``plugin/admission.py``) against its plain-Python count rule."""
    assert r["admitted"] > 0 and r["rejected"] > 0 and r["late"] > 0, (
        f"the traffic admitted {r['admitted']} IDs, {r['late']} of them after a rejection, and left {r['rejected']} "
        "rejected: the case proves nothing unless each is positive")
    assert kernel != "key_value" or r["swapped_in"] > 0, (
        "no admitted row came back to the KEY_VALUE cache from host memory: the case proves nothing about them")
    assert not r["unexpected"] and not r["missing"], (
        f"rejected IDs hold rows ({r['unexpected']}) or admitted IDs hold none ({r['missing']}): exactly the IDs the "
        "count rule admits must get a row")
    assert r["fwd_err"] <= TOLERANCE and r["row_err"] <= TOLERANCE, (
        f"outputs differ from the admission oracle by {r['fwd_err']} (batches {r['bad_steps']} on rank 0), final rows "
        f"by {r['row_err']}: a rejected ID must read not_admitted_value and train nothing, an admitted one train as "
        "a new row")

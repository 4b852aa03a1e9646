"""The conformance cases follow the device's backend profile: every supported combination once, nothing else run.

Oracle: the cross product of what a (generated) profile declares and what TorchRec and the scripts offer, written
out with itertools; invariants for the quick subsets (inside the full run, at least one case per area).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Tuple

from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.backends import profile_for
from torchrec_ascend.conformance_tests import cases as C

ALL_TYPES = C.STOCK_SHARDING_TYPES["ebc"]
FBGEMM_OPTIMIZERS = (*C.SCRIPT_OPTIMIZERS.values(), "ADAM", "PARTIAL_ROWWISE_ADAM", "EMAINPLACE_ROWWISE_ADAGRAD")
# The Adam cases, written out: (script name, fbgemm name, the (kind, sharding type) pairs each runs).
ADAM = (("adam", "ADAM", {("ebc", "row_wise"), ("ec", "column_wise"), ("ec", "table_wise")}),
        ("partial_rowwise_adam", "PARTIAL_ROWWISE_ADAM", {("ebc", "column_wise")}))
KERNELS = ("fused", "key_value", "fused_uvm_caching")


@dataclasses.dataclass(frozen=True)
class FakeProfile:
    """The profile fields the case derivation reads."""

    device_type: str
    sharding_types: Tuple[str, ...]
    compute_kernels: Tuple[str, ...]
    fused_optimizers: Tuple[str, ...]


profiles = st.builds(
    FakeProfile,
    device_type=st.sampled_from(["cpu", "npu"]),
    sharding_types=st.lists(st.sampled_from(ALL_TYPES), unique=True).map(tuple),
    compute_kernels=st.lists(st.sampled_from(KERNELS), unique=True).map(tuple),
    fused_optimizers=st.lists(st.sampled_from(FBGEMM_OPTIMIZERS), unique=True).map(tuple),
)
DERIVATIONS = (C.sharding_cases, C.hash_table_cases, C.key_value_cases, C.pipeline_cases)


def combination(case):
    """What a case checks, without how long it runs (quick runs fewer steps)."""
    return tuple(sorted((k, v) for k, v in case.params.items() if k != "steps"))


def runnable_grid(cases):
    return sorted((c.params["kind"], c.params["sharding_type"], c.params["optimizer"])
                  for c in cases if not c.skip and "optimizer" in c.params)


def expected_grid(profile, types):
    optimizers = [n for n, f in C.SCRIPT_OPTIMIZERS.items() if f in profile.fused_optimizers]
    adam = [(kind, t, name) for name, fbgemm, pairs in ADAM if fbgemm in profile.fused_optimizers
            for kind, t in pairs if t in types.get(kind, ()) and t in profile.sharding_types]
    return sorted([(kind, t, o) for kind, kind_types in types.items()
                   for t, o in itertools.product(kind_types, optimizers) if t in profile.sharding_types] + adam)


@settings(deadline=None, max_examples=60)
@given(profiles, st.integers(1, 4))
def test_sharding_grid_is_exactly_what_the_device_supports(profile: FakeProfile, world: int) -> None:
    cases = C.sharding_cases(profile, world, quick=False)
    assert runnable_grid([c for c in cases if "setting" not in c.params]) == expected_grid(
        profile, C.STOCK_SHARDING_TYPES)
    settings = [c.params["setting"] for c in cases if "setting" in c.params]  # one per setting the device can run
    assert settings == ([name for name, (_, types) in C.STOCK_VARIANTS.items()
                         if set(types) & set(profile.sharding_types)]
                        if "EXACT_ROWWISE_ADAGRAD" in profile.fused_optimizers else [])
    hash_cases = C.hash_table_cases(profile, world, quick=False)
    extras = ("dedup", "state_dict", "variant", "promise")  # zip below pairs the first two with their module kinds
    assert runnable_grid([c for c in hash_cases if not any(k in c.params for k in extras)]) == expected_grid(
        profile, C.HASH_SHARDING_TYPES)
    rowwise = "EXACT_ROWWISE_ADAGRAD" in profile.fused_optimizers
    for extra, kind in zip(extras, ("ec", "ebc")):  # state_dict: the round trips into the same layout
        types = sorted(c.params["sharding_type"] for c in hash_cases
                       if extra in c.params and c.params[extra] in ("index_dedup", c.params["sharding_type"]))
        assert types == sorted(t for t in C.HASH_SHARDING_TYPES[kind] if t in profile.sharding_types and rowwise)
    moved = [(c.params["sharding_type"], c.params["state_dict"]) for c in hash_cases
             if "state_dict" in c.params and c.params["state_dict"] != c.params["sharding_type"]]
    both = {"row_wise", "table_wise"} <= set(profile.sharding_types)
    assert moved == ([("row_wise", "table_wise")] if both and rowwise else [])
    skipped = {c.params.get("optimizer") or c.params.get("kernel"): c.skip for c in cases if c.skip}
    for name, fbgemm in C.SCRIPT_OPTIMIZERS.items():
        if fbgemm not in profile.fused_optimizers:
            assert skipped[name] == f"{fbgemm} is not supported on {profile.device_type}"
    for fbgemm in set(profile.fused_optimizers) - set(C.SCRIPT_OPTIMIZERS.values()) - {f for _, f, _ in ADAM}:
        assert "no unsharded oracle" in skipped[fbgemm]
    assert "fused_uvm_caching" in skipped or "fused_uvm_caching" not in profile.compute_kernels


@settings(deadline=None, max_examples=60)
@given(profiles, st.integers(1, 4))
def test_case_ids_are_unique_and_quick_is_a_non_empty_subset(profile: FakeProfile, world: int) -> None:
    for derive in DERIVATIONS:
        full = derive(profile, world, quick=False)
        quick = derive(profile, world, quick=True)
        assert len({c.id for c in full}) == len(full), derive.__name__
        runnable = [combination(c) for c in full if not c.skip]
        assert {combination(c) for c in quick if not c.skip} <= set(runnable), derive.__name__
        if runnable:
            assert any(not c.skip for c in quick), f"{derive.__name__}: quick dropped the area"


@settings(deadline=None, max_examples=30)
@given(profiles, st.integers(1, 4))
def test_split_types_must_really_split(profile: FakeProfile, world: int) -> None:
    for case in C.sharding_cases(profile, world, quick=False):
        if case.skip or "sharding_type" not in case.params or case.params["kind"] == "dcp":
            continue
        st_ = case.params["sharding_type"]
        splits = st_ in C.COLUMN_SPLITS or (st_ in C.ROW_SPLITS and world > 1)
        assert case.expect["min_shards"] == (2 if splits else 1)


def test_hash_sharding_types_match_the_hybrid_sharders() -> None:
    from torchrec_ascend.sharders import HASH_SHARDING_TYPES

    assert C.HASH_SHARDING_TYPES["ebc"] == HASH_SHARDING_TYPES
    assert set(C.HASH_SHARDING_TYPES["ec"]) == set(HASH_SHARDING_TYPES) & set(C.STOCK_SHARDING_TYPES["ec"])


def test_cpu_runs_one_case_per_area_when_quick() -> None:
    cpu = profile_for("cpu")
    for derive in DERIVATIONS:
        assert [c for c in derive(cpu, 2, quick=True) if not c.skip], derive.__name__
    assert C.error_cases(cpu, quick=True)
    assert {c.id for c in C.error_cases(cpu, quick=True)} <= {c.id for c in C.error_cases(cpu, quick=False)}


def test_key_value_is_skipped_with_the_reason_where_not_offered() -> None:
    profile = FakeProfile("npu", ALL_TYPES, ("fused",), tuple(C.SCRIPT_OPTIMIZERS.values()))
    (case,) = C.key_value_cases(profile, 2, quick=False)
    assert case.skip == "the key_value kernel is not offered on npu"


def test_policy_cases_use_the_requested_ones_else_every_installed_one() -> None:
    installed = [("eviction", "lru"), ("eviction", "ttl"), ("admission", "count")]
    cases = C.policy_cases([], installed)
    assert [(c.params, c.expect["options"]) for c in cases] == [
        ({"policy": "lru", "kind": "eviction"}, {}),
        ({"policy": "ttl", "kind": "eviction"}, C.EXAMPLE_POLICY_OPTIONS[("eviction", "ttl")]),
        ({"policy": "count", "kind": "admission"}, {}),
    ]
    requested = C.policy_cases([("ttl", {"ttl_steps": 5})], installed)
    assert [(c.params, c.expect["options"]) for c in requested] == [({"policy": "ttl"}, {"ttl_steps": 5})]

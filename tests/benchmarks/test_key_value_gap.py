"""The KEY_VALUE benchmark's account of a step (``bench_key_value.step_gap``), against figures worked by hand."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_key_value import step_gap


def test_the_gap_note_splits_the_step_and_says_what_bounds_the_ratio() -> None:
    # 10 steps: FUSED 100 ms (10 a step), KEY_VALUE 160 ms (16 a step) on rank 1, whose mapping is the longer
    fused = [{"seconds": 0.1, "mapping_s": 0.004}, {"seconds": 0.1, "mapping_s": 0.005}]
    key_value = [
        {"seconds": 0.15, "mapping_s": 0.03, "host store_s": 0.01, "row copies_s": 0.005, "policy_s": 0.005},
        {"seconds": 0.16, "mapping_s": 0.04, "host store_s": 0.02, "row copies_s": 0.005, "policy_s": 0.005},
    ]
    note, bound = step_gap(fused, key_value, 10, "KEY_VALUE lru")
    assert "(rank 1, the longer mapping" in note
    assert "16.00 ms against 10.00 ms, a gap of 6.00 ms" in note
    assert "takes 4.00 ms (3.50 more than FUSED's): host store 2.00, row copies 0.50" in note
    assert "eviction policy 0.50, slot tables and the rest 1.00" in note
    assert "outside the mapping 2.50 ms" in note
    # 0.8x needs 10 / 0.8 = 12.5 ms, 3.5 less than 16; without the host store's 2 ms: 10 / 14 = 0.71
    assert "0.8x FUSED needs a step of 12.50 ms, 3.50 less; with the host store free the step would be 0.71x" in note
    assert bound.startswith("the host work a KEY_VALUE lru step adds to a FUSED one, 6.00 ms a step")
    assert bound.endswith("with the host store free the ratio would be 0.71")

"""The hash FUSED benchmark's account of what bounds hash / stock (``bench_hash_fused.mapping_bound``), against
figures worked by hand."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_hash_fused import mapping_bound


def test_the_bound_is_one_less_the_mapping_share_and_gives_the_rounds_spread() -> None:
    hashed = {"mapping_share": 0.04, "samples_per_s": [90.0, 120.0, 100.0]}
    stock = {"samples_per_s": [100.0, 100.0, 125.0]}
    bound = mapping_bound(hashed, stock)
    assert "ID mapping on the host (4.0% of the step, the worse rank), so about 0.96x stock" in bound
    assert bound.endswith("single rounds' ratios ranged 0.80-1.20 in this run")  # 100/125 and 120/100

"""The soak benchmark's short form (issue 29, item 4): ``benchmarks/bench_soak.py`` at ``run_all.SOAK_SHORT`` size
(1500 steps of Zipf traffic through a 256-row cache, 32 KiB of host memory, 64 KiB disk segments) through the
benchmark runner. At every checkpoint the tiers, read back themselves, hold every ID sent exactly once and agree with
the counters; the disk files stay within 2x the live rows while they churn (compaction ran); open files are the
segments' plus a constant.
The 100,000-step figures are in ``benchmarks/REPORT.md`` (``run_all.py --only soak``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import run_all


def test_short_soak_keeps_counters_consistent_and_disk_within_twice_the_live_rows() -> None:
    soak = next(b for b in run_all.BENCHMARKS if b.name == "soak")
    outcome = run_all.run(soak, smoke=True, timeout=300)
    assert not outcome.error, f"{outcome.error}\n{outcome.output[-3000:]}"
    rows, targets = outcome.result["rows"], {t["what"]: t for t in outcome.result["targets"]}
    assert len(rows) >= 4
    assert all(r["tiers_sum_ok"] and r["disjoint"] and r["covers"] for r in rows), rows
    assert targets["checkpoints with consistent tier counters (fraction)"]["met"]
    assert targets["disk bytes / live disk bytes (worst checkpoint)"]["met"], targets
    assert rows[-1]["compactions"] > 0 and rows[-1]["disk_rows"] > rows[-1]["host_rows"], "no churn on disk"
    assert rows[-1]["spilled_rows"] > rows[-1]["ids_sent"], "rows did not move down more than once each on average"
    # One descriptor per segment file and nothing else grows: a compacted (deleted) segment's is closed.
    assert len({r["open_files"] - r["segments"] for r in rows}) == 1, [(r["open_files"], r["segments"]) for r in rows]

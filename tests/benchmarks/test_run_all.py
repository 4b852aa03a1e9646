"""The benchmark runner: parsers of the scripts' printed tables, targets, the report, and a smoke run of each one.

Parsers are checked on output captured from the scripts (exact values as oracle); the smoke tests run every
benchmark at its tiny ``--smoke`` size through the runner and check a complete result came back (2-rank ones
included: about a minute in all).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import run_all
from results import make_result, target

ID_MAP_OUT = """\
8 batches of 1048576 Zipf(1.05) IDs, 4165609 distinct in all, capacity 10000000, torch threads 1
IdMap (native)         first batch   108.09 M IDs/s   later batches (median of 7)   101.50 M IDs/s
Python dict            first batch     1.41 M IDs/s   later batches (median of 2)     1.05 M IDs/s
ratio IdMap / dict:    96.7x (later-batch medians)
pandas khash           first batch    20.03 M IDs/s   later batches (median of 7)    15.20 M IDs/s
ratio IdMap / khash:    6.7x (later-batch medians)
"""

POLICIES_OUT = """\
eviction: cache 100000 slots, 16384 distinct keys per batch, Zipf(1.05) over 1000000 keys, median of 30 batches
policy        ms/batch   vs lru
lfu              1.542     0.94
lru              1.643     1.00
s3fifo           3.594     2.19

admission: admit() of 16384 new keys, median of 20 calls
policy          ms/batch  vs count
count              4.834      1.00
probabilistic      0.160      0.03
"""

STORES_OUT = """\
rows=262144 batch=16384 width=128 float32 repeats=7 (medians)
scenario                  op     ms/batch   Mrows/s      MB/s  x baseline
index_select/index_copy_  put        2.00      8.20      4200         1.0
index_select/index_copy_  get        0.78     20.87     10687         1.0
host                      put        6.96      2.36      1206         3.5
host+disk                 get       30.16      0.54       278        38.4
host+disk end state: host_rows=69173 disk_rows=192971 spilled_rows=385787 promoted_rows=96480 disk_bytes=203695536
"""

PIPELINE_OUT = "\n".join([
    "",
    "--device-ms 0.0, rows as mapped: 4 tables x 100000 rows x dim 16, row_wise; batch 512, 32 "
    "IDs/sample/table; 5 runs x 20 steps",
    "  serial step (depth 1, rank 0): LOAD 1.72 ms, SPLIT 0.71 ms, COMPUTE 13.54 ms",
    "  host stages 7.0 ms = 34% of a serial step (compute 13.5 ms, of which 0.0 ms emulated device time)",
    "     stock:  43.88 steps/s (runs: 43.0, 43.9)  vs depth 1: 0.96x  vs stock: 1.00x  cores busy 1.43",
    "   depth 1:  45.56 steps/s (runs: 35.9, 46.5)  vs depth 1: 1.00x  vs stock: 1.04x  compute 13.54 ms "
    "of a 21.95 ms step, cores busy 1.32",
    "   depth 3:  73.63 steps/s (runs: 64.5, 90.7)  vs depth 1: 1.62x  vs stock: 1.68x  compute 13.20 ms "
    "of a 13.58 ms step, cores busy 1.60",
    "  ceilings of depth 3: a step is no shorter than its compute, 13.20 ms here (13.54 at depth 1: the "
    "host lanes share the rank's Python interpreter and cores with it), against a serial step of "
    "21.95 ms: 1.66x; the cores depth 1 leaves idle "
    "(1.32 of 2 busy): 1.52x if a step's CPU work stays what it is at depth 1",
    "",
    "--device-ms 0.0, rows spread: 4 tables x 100000 rows x dim 16, row_wise; batch 512, 32 "
    "IDs/sample/table; 5 runs x 20 steps",
    "  serial step (depth 1, rank 0): LOAD 0.97 ms, SPLIT 0.56 ms, COMPUTE 7.40 ms",
    "  host stages 4.1 ms = 36% of a serial step (compute 7.4 ms, of which 0.0 ms emulated device time)",
    "     stock:  91.02 steps/s (runs: 79.7, 91.0)  vs depth 1: 1.15x  vs stock: 1.00x  cores busy 1.54",
    "   depth 1:  78.94 steps/s (runs: 72.7, 78.9)  vs depth 1: 1.00x  vs stock: 0.87x  compute 7.40 ms "
    "of a 12.67 ms step, cores busy 1.45",
    "   depth 3:  95.64 steps/s (runs: 77.6, 95.6)  vs depth 1: 1.21x  vs stock: 1.05x  compute 10.13 ms "
    "of a 10.46 ms step, cores busy 1.59",
    "  ceilings of depth 3: a step is no shorter than its compute, 10.13 ms here (7.40 at depth 1: the "
    "host lanes share the rank's Python interpreter and cores with it), against a serial step of "
    "12.67 ms: 1.25x; the cores depth 1 leaves idle "
    "(1.45 of 2 busy): 1.38x if a step's CPU work stays what it is at depth 1",
    "",
    "--device-ms 8.0, rows as mapped: 4 tables x 100000 rows x dim 16, row_wise; batch 512, 32 "
    "IDs/sample/table; 5 runs x 20 steps",
    "  serial step (depth 1, rank 0): LOAD 2.03 ms, SPLIT 0.76 ms, COMPUTE 20.79 ms",
    "  host stages 7.7 ms = 27% of a serial step (compute 20.8 ms, of which 8.0 ms emulated device time)",
    "     stock:  35.31 steps/s (runs: 33.9, 35.3)  vs depth 1: 1.07x  vs stock: 1.00x  cores busy 0.91",
    "   depth 1:  33.09 steps/s (runs: 29.3, 32.3)  vs depth 1: 1.00x  vs stock: 0.94x  compute 20.79 ms "
    "of a 30.22 ms step, cores busy 0.88",
    "   depth 3:  43.03 steps/s (runs: 43.0, 39.4)  vs depth 1: 1.30x  vs stock: 1.22x  compute 22.10 ms "
    "of a 23.24 ms step, cores busy 1.10",
    "  ceilings of depth 3: a step is no shorter than its compute, 22.10 ms here (20.79 at depth 1: the "
    "host lanes share the rank's Python interpreter and cores with it), against a serial step of "
    "30.22 ms: 1.37x; the cores depth 1 leaves idle "
    "(0.88 of 2 busy): 2.27x if a step's CPU work stays what it is at depth 1",
    "",
])


def test_parse_id_map_reads_rates_and_judges_the_100m_target() -> None:
    result = run_all.parse_id_map(ID_MAP_OUT)
    ours, plain, khash = result["rows"]
    assert ours["contender"] == "IdMap (native)"
    assert (ours["later batches M IDs/s"], ours["first batch M IDs/s"]) == (101.5, 108.09)
    assert ours["vs dict"] == pytest.approx(101.5 / 1.05)
    assert plain["contender"] == "Python dict"
    assert (khash["contender"], khash["later batches M IDs/s"]) == ("pandas khash", 15.2)
    assert result["targets"] == [target("IdMap later-batch M IDs/s", 101.5, ">=", 100.0)]
    assert result["targets"][0]["met"]
    assert any(note.startswith("ratio IdMap / khash") for note in result["notes"])
    reads = ("random reads: 583812 distinct IDs per later batch (median); 583812 random 16-byte reads from a table "
             "of the IdMap's size (torch index_select) take 10.01 ms: 104.7 M IDs/s if each distinct ID cost one such "
             "read and nothing else")
    slow = run_all.parse_id_map(ID_MAP_OUT.replace("101.50 M IDs/s", " 98.22 M IDs/s") + reads + "\n")
    assert not slow["targets"][0]["met"] and slow["targets"][0]["bound"] == reads
    skipped = "pandas khash           skipped (pandas is not installed)"
    without_pandas = "\n".join(ID_MAP_OUT.splitlines()[:4] + [skipped])
    assert any("skipped" in note for note in run_all.parse_id_map(without_pandas)["notes"])


def test_parse_policies_reads_both_tables() -> None:
    rows = run_all.parse_policies(POLICIES_OUT)["rows"]
    assert [(r["kind"], r["policy"], r["ms/batch"], r["vs baseline"]) for r in rows] == [
        ("eviction", "lfu", 1.542, 0.94), ("eviction", "lru", 1.643, 1.0), ("eviction", "s3fifo", 3.594, 2.19),
        ("admission", "count", 4.834, 1.0), ("admission", "probabilistic", 0.16, 0.03),
    ]


def test_parse_stores_reads_every_scenario_and_op() -> None:
    rows = run_all.parse_stores(STORES_OUT)["rows"]
    assert [(r["scenario"], r["op"], r["x baseline time"]) for r in rows] == [
        ("index_select/index_copy_", "put", 1.0), ("index_select/index_copy_", "get", 1.0), ("host", "put", 3.5),
        ("host+disk", "get", 38.4),
    ]
    assert rows[2]["ms/batch"] == 6.96 and rows[2]["MB/s"] == 1206


def test_parse_pipeline_applies_the_target_only_where_host_stages_reach_30_percent() -> None:
    result = run_all.parse_pipeline(PIPELINE_OUT)
    assert len(result["rows"]) == 9
    assert [r["host share %"] for r in result["rows"]] == [34] * 3 + [36] * 3 + [27] * 3
    assert [r["rows"] for r in result["rows"]] == ["as mapped"] * 3 + ["spread"] * 3 + ["as mapped"] * 3
    stock, depth_1 = result["rows"][3:5]
    assert (stock["compute ms/step"], stock["cores busy"]) == ("-", 1.54)  # stock's stages are not timed
    assert (depth_1["compute ms/step"], depth_1["cores busy"]) == (7.4, 1.45)
    mapped, spread = result["targets"]
    assert mapped["value"] == 1.62 and mapped["met"] and "--device-ms 0, rows as mapped" in mapped["what"]
    assert spread["value"] == 1.21 and not spread["met"] and "--device-ms 0, rows spread" in spread["what"]
    assert spread["bound"].startswith("a step is no shorter than its compute, 10.13 ms here")
    assert spread["bound"].endswith("(1.45 of 2 busy): 1.38x if a step's CPU work stays what it is at depth 1")
    assert any("27%" in note and "does not apply" in note for note in result["notes"])


def test_the_report_says_what_bounds_a_target_it_does_not_meet() -> None:
    result = run_all.parse_pipeline(PIPELINE_OUT)
    pipeline = next(b for b in run_all.BENCHMARKS if b.name == "pipeline")
    outcome = run_all.Outcome(pipeline, ["python", "bench_pipeline.py"], 3.0, 0, PIPELINE_OUT, result=result)
    text = run_all.report([outcome], smoke=False, started=run_all.datetime.datetime(2030, 1, 2), load_before="1",
                          setting=[], figure_lines=[])
    missed = next(line for line in text.splitlines() if line.startswith("- Target:") and "rows spread" in line)
    assert missed.endswith("**not met**. What bounds it on this machine: " + result["targets"][1]["bound"] + ".")
    met = next(line for line in text.splitlines() if line.startswith("- Target:") and "rows as mapped" in line)
    assert met.endswith(", met.")  # a met target's ceilings are in its raw output, not repeated


@pytest.mark.parametrize("parse", [run_all.parse_id_map, run_all.parse_policies, run_all.parse_stores,
                                   run_all.parse_pipeline])
def test_parsers_reject_output_of_another_shape(parse) -> None:
    with pytest.raises(run_all.ParseError):
        parse("Traceback (most recent call last):\nRuntimeError: boom\n")


def test_target_verdicts() -> None:
    assert target("x", 0.85, ">=", 0.85)["met"] and not target("x", 0.84, ">=", 0.85)["met"]
    assert target("x", 10.0, "<=", 10)["met"] and not target("x", 10.5, "<=", 10)["met"]
    assert not target("x", None, ">=", 0)["met"]
    with pytest.raises(ValueError, match="comparison"):
        target("x", 1.0, ">", 0.5)


def test_a_measured_figure_reads_as_its_threshold_only_when_it_is_the_threshold() -> None:
    assert run_all.fmt_measured(target("x", 0.9488, ">=", 0.95)) == "0.9488"  # "0.95", not met, misled a reader
    assert run_all.fmt_measured(target("x", 100.01, ">=", 100)) == "100.01"
    assert run_all.fmt_measured(target("x", 0.95, ">=", 0.95)) == "0.95"
    assert run_all.fmt_measured(target("x", 0.73, ">=", 0.8)) == "0.73"  # far from it: fmt's digits
    assert run_all.fmt_measured(target("x", None, ">=", 0.8)) == "not measured"


@settings(max_examples=300, deadline=None)
@given(value=st.floats(min_value=1e-3, max_value=1e6), threshold=st.sampled_from([0.05, 0.4, 0.5, 0.8, 0.9, 0.95,
                                                                                 1, 1.3, 2, 5, 100]),
       nudge=st.sampled_from([0, 1, -1, 1e-9, -1e-9, 1e-3, -1e-3]))
def test_measured_figures_never_round_onto_their_threshold(value: float, threshold: float, nudge: float) -> None:
    value = threshold * (1 + nudge) if nudge else value
    shown = float(run_all.fmt_measured(target("x", value, ">=", threshold)).replace(",", ""))
    assert (shown == threshold) == (value == threshold), (value, threshold, shown)


def test_report_lists_failures_and_targets() -> None:
    ok = run_all.Outcome(run_all.BENCHMARKS[0], ["python", "bench_id_map.py"], 3.0, 0, ID_MAP_OUT,
                         result=run_all.parse_id_map(ID_MAP_OUT))
    broken = run_all.Outcome(run_all.BENCHMARKS[1], ["python", "bench_policies.py"], 1.0, 1, "boom",
                             error="exited with status 1")
    started = run_all.datetime.datetime(2030, 1, 2)
    setting = ["- Software: commit 0123abc (taken when the run started)"]
    figure_lines = ["", "![figure](REPORT.svg)"]
    text = run_all.report([ok, broken], smoke=False, started=started, load_before="1", setting=setting,
                          figure_lines=figure_lines)
    summary, _, sections = text.partition("\n## id_map")
    assert "\n".join(figure_lines) in summary and "REPORT.svg" not in sections  # under the summary, once
    assert setting[0] in text and "- Machine:" not in text  # what ran, not the tree when the report is written
    assert "| id_map: IdMap later-batch M IDs/s | >= 100 | 102 | yes |" in text
    assert "| policies | | **exited with status 1** | no |" in text
    assert "2030-01-02" in text and "boom" in text


cells = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32), st.integers(), st.booleans(),
                  st.text(alphabet="ab |x", max_size=5))


rows_of_cells = st.lists(st.dictionaries(st.sampled_from(["a", "b", "c"]), cells, min_size=1, max_size=3),
                         min_size=1, max_size=5)


@settings(deadline=None, max_examples=30)
@given(rows_of_cells)
def test_table_has_one_line_per_row_and_a_cell_per_column(rows) -> None:
    lines = run_all.table(rows)
    columns = {k for row in rows for k in row}
    assert len(lines) == len(rows) + 2
    for line in lines:  # escaped pipes inside cells do not count as separators
        assert line.replace("\\|", "").count("|") == len(columns) + 1


def test_make_result_keeps_its_parts() -> None:
    result = make_result("t", "b", [{"x": 1}], [], ["n"])
    assert result == {"title": "t", "baseline": "b", "rows": [{"x": 1}], "targets": [], "notes": ["n"]}


@pytest.mark.benchmarks
@pytest.mark.parametrize("benchmark", run_all.BENCHMARKS, ids=lambda b: b.name)
def test_every_benchmark_runs_at_smoke_size(benchmark) -> None:
    outcome = run_all.run(benchmark, smoke=True, timeout=300)
    assert not outcome.error, f"{benchmark.name}: {outcome.error}\n{outcome.output[-3000:]}"
    assert outcome.result["rows"], outcome.output
    assert all(isinstance(t["value"], float) for t in outcome.result["targets"]), outcome.result["targets"]

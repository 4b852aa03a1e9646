"""The report's figure (``benchmarks/plot.py``, ``run_all.figure``): every variant of a training benchmark drawn at
its median with its runs, labelled as its table row; and a report that says why when there is no figure.

Oracle: the result's own rows (a panel holds exactly their figures), and the SVG's text (it keeps text as text).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import plot
import run_all
from results import make_result


def outcome(name: str, result: Dict[str, Any]) -> run_all.Outcome:
    benchmark = next(b for b in run_all.BENCHMARKS if b.name == name)
    return run_all.Outcome(benchmark, ["python", benchmark.script], 1.0, 0, "", result=result)


def training_result(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    return make_result("KEY_VALUE vs FUSED", "FUSED", rows, [], throughput=("samples/s", ["model"]))


KEY_VALUE_ROWS = [
    {"model": "FUSED", "samples/s": 81650.0, "vs FUSED": 1.0, "runs": "80484, 111171, 81650"},
    {"model": "KEY_VALUE lru", "samples/s": 59297.0, "vs FUSED": 0.68, "runs": "59297, 57171, 63077"},
]


labels = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_ ", min_size=1, max_size=12).map(str.strip).filter(bool)
figures = st.floats(min_value=0.5, max_value=1e6, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(labels, figures, st.lists(figures, max_size=9)), min_size=1, max_size=8),
       depth=st.floats(min_value=0, max_value=20, allow_nan=False))
def test_a_panel_holds_each_rows_label_median_and_runs(rows, depth) -> None:
    result = make_result("t", "b", [{"pipeline": label, "device ms": depth, "steps/s": median,
                                     "runs": ", ".join(repr(r) for r in runs)} for label, median, runs in rows],
                         [], throughput=("steps/s", ["pipeline", "device ms"]))
    panel = plot.panel("pipeline", result)
    assert panel.unit == "steps/s" and panel.title == "pipeline: t"
    assert [(b.label, b.median, b.runs) for b in panel.bars] == [
        (f"{label}, device ms {depth:g}", median, runs) for label, median, runs in rows]


def test_a_result_without_throughput_has_no_panel() -> None:
    assert plot.panel("id_map", make_result("t", "b", [{"x": 1.0}], [])) is None


def test_the_figure_shows_every_variant_and_its_median(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the one test that draws; the test extra installs it
    path = tmp_path / "REPORT.svg"
    lines = run_all.figure([outcome("key_value", training_result(KEY_VALUE_ROWS)),
                            outcome("id_map", make_result("t", "b", [{"x": 1.0}], []))], path)
    assert "![training throughput per variant](REPORT.svg)" in lines
    svg = path.read_text()
    for text in ["key_value: KEY_VALUE vs FUSED", "FUSED", "KEY_VALUE lru", "81,650", "59,297", "samples/s"]:
        assert text in svg, text


def test_the_report_says_why_it_has_no_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "REPORT.svg"
    broken = training_result([{"model": "FUSED", "runs": "1, 2"}])  # no samples/s
    assert run_all.figure([outcome("key_value", broken)], path) == [
        "", "**No figure: key_value: a row of its result has no ['samples/s'] column(s): "
            "{'model': 'FUSED', 'runs': '1, 2'}.**"]

    def no_matplotlib(*args: Any) -> None:
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(plot, "draw", no_matplotlib)
    lines = run_all.figure([outcome("key_value", training_result(KEY_VALUE_ROWS))], path)
    assert any("No figure: matplotlib is not installed" in line for line in lines)
    assert not path.exists()


def test_a_report_without_training_benchmarks_leaves_no_earlier_figure(tmp_path: Path) -> None:
    path = tmp_path / "REPORT.svg"
    path.write_text("<svg>an earlier run's</svg>")
    assert run_all.figure([outcome("id_map", make_result("t", "b", [{"x": 1.0}], []))], path) == []
    assert not path.exists()

"""The report's figure: training throughput per variant, one panel per benchmark that measures it.

A result (``results.py``) that names its ``throughput`` column and the columns that label a row is drawn as one
horizontal bar per row at the row's median, with a dot per run: on a shared 2-core machine single runs spread by
tens of percent, and the dots show how far the medians can be trusted. ``run_all.py`` writes the figure next to the
report (``REPORT.svg`` beside ``REPORT.md``) and shows it under the summary. The SVG keeps its text as text, so the
labels can be searched and diffed.

Example::

    panels = [p for p in (panel(name, result) for name, result in results.items()) if p is not None]
    draw(panels, "benchmarks/REPORT.svg")   # ImportError when matplotlib is not installed
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional


@dataclasses.dataclass(frozen=True)
class Bar:
    """One row of a result: its label, median throughput and the throughput of each run."""

    label: str
    median: float
    runs: List[float]


@dataclasses.dataclass(frozen=True)
class Panel:
    """One benchmark's bars, in the order of its result's rows; ``unit`` is the throughput column's name."""

    title: str
    unit: str
    bars: List[Bar]


def runs_of(cell: Any) -> List[float]:
    """The per-run figures of a result's ``runs`` cell (``"96040, 104060, ..."``; a missing cell: none).

    Raises:
        ValueError: a run is not a number.
    """
    return [float(run) for run in str(cell or "").split(",") if run.strip()]


def figure_text(value: float) -> str:
    """A median as the figure writes it beside its bar: ``88,901``, ``77``, ``0.97``."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def panel(name: str, result: Dict[str, Any]) -> Optional[Panel]:
    """The panel of benchmark ``name``'s ``result``, or None if the result names no throughput column.

    Raises:
        ValueError: a row lacks the throughput column or a label column, or its runs are not numbers.

    Example::

        panel("hash_fused", {"title": "...", "rows": [{"variant": "stock", "samples/s": 9e4, "runs": "9e4"}],
                             "throughput": {"column": "samples/s", "labels": ["variant"]}, ...})
    """
    spec = result.get("throughput")
    if not spec:
        return None
    column, labels = spec["column"], spec["labels"]
    bars = []
    for row in result["rows"]:
        missing = [c for c in [column, *labels] if c not in row]
        if missing:
            raise ValueError(f"{name}: a row of its result has no {missing} column(s): {row}")
        label = ", ".join(str(row[c]) if isinstance(row[c], str) else f"{c} {row[c]:g}" for c in labels)
        bars.append(Bar(label, float(row[column]), runs_of(row.get("runs"))))
    return Panel(f"{name}: {result['title']}", column, bars)


def draw(panels: List[Panel], path: str) -> None:
    """Draw ``panels`` one under the other into ``path`` (the format from its suffix: ``.svg``, ``.png``...).

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    heights = [0.4 * len(p.bars) + 0.9 for p in panels]
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "torchrec-ascend", "font.size": 9}):
        fig, axes = plt.subplots(len(panels), 1, figsize=(9, sum(heights)), squeeze=False,
                                 gridspec_kw={"height_ratios": heights})
        for ax, p in zip(axes[:, 0], panels):
            rows = range(len(p.bars))
            ax.barh(rows, [b.median for b in p.bars], color="#9ecae1", label="median")
            dots = [(run, y) for y, b in zip(rows, p.bars) for run in b.runs]
            if dots:
                ax.plot([x for x, _ in dots], [y for _, y in dots], "k.", markersize=3, label="one run")
            for y, b in zip(rows, p.bars):  # inside the bar's start: clear of the runs' dots around its end
                ax.annotate(figure_text(b.median), (0, y), xytext=(4, 0), textcoords="offset points", va="center",
                            fontsize=8)
            ax.xaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
            ax.set_yticks(list(rows), [b.label for b in p.bars])
            ax.invert_yaxis()  # the result's first row on top, as in its table
            ax.set_xlabel(p.unit)
            ax.set_title(p.title, fontsize=9, loc="left")
            ax.legend(loc="lower right", fontsize=7)
        fig.tight_layout()
        fig.savefig(path, metadata={"Date": None})  # no timestamp: the same figures give the same file
        plt.close(fig)

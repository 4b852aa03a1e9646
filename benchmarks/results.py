"""The result every benchmark hands to ``run_all.py``: a table of medians and ratios, plus targets met or not.

A result is plain JSON: ``{"title", "baseline", "rows", "targets", "notes"}``, and ``"throughput"`` for a
benchmark of training speed (drawn in the report's figure). ``rows`` is a list of flat dicts
(one table row each; the columns are the union of their keys, in first-seen order), ``targets`` a list of
:func:`target` records (each may say what bounds its figure on this machine). Benchmarks with ``--json PATH``
write one; ``run_all.py`` builds the same shape from the printed output of the scripts that have no such flag.

Example::

    result = make_result("hash vs stock FUSED", baseline="stock FUSED, same run",
                         rows=[{"variant": "hash row_wise", "samples/s": 5100.0, "vs stock": 0.93}],
                         targets=[target("hash / stock, row_wise", 0.93, ">=", 0.85)])
    write_result("out.json", result)
"""

from __future__ import annotations

import json
import operator
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

COMPARISONS = {">=": operator.ge, "<=": operator.le}


def target(what: str, value: Optional[float], comparison: str, threshold: float,
           bound: Optional[str] = None) -> Dict[str, Any]:
    """A target record: ``what`` measured ``value``; met when ``value <comparison> threshold``.

    Args:
        what: what is compared, in words (e.g. ``"hash / stock samples/s, row_wise"``).
        value: the measured value; None when it could not be measured (then the target is not met).
        comparison: ``">="`` or ``"<="``.
        threshold: the target value.
        bound: what bounds the figure on this machine, from what the same run measured (the report shows it under
            a target not met).

    Raises:
        ValueError: ``comparison`` is neither ``">="`` nor ``"<="``.
    """
    if comparison not in COMPARISONS:
        raise ValueError(f"target {what!r}: comparison must be one of {sorted(COMPARISONS)}, got {comparison!r}")
    met = value is not None and COMPARISONS[comparison](value, threshold)
    record = {"what": what, "value": value, "target": f"{comparison} {threshold:g}", "threshold": threshold, "met": met}
    return {**record, "bound": bound} if bound else record


def make_result(title: str, baseline: str, rows: List[Dict[str, Any]], targets: List[Dict[str, Any]],
                notes: Optional[List[str]] = None,
                throughput: Optional[Tuple[str, List[str]]] = None) -> Dict[str, Any]:
    """A benchmark result (see the module docstring); ``notes`` are lines shown under the table; ``throughput``:
    the column of the rows' training throughput and the columns that label a row, for the report's figure
    (``plot.py``)."""
    result = {"title": title, "baseline": baseline, "rows": rows, "targets": targets, "notes": list(notes or [])}
    if throughput is not None:
        result["throughput"] = {"column": throughput[0], "labels": list(throughput[1])}
    return result


def write_result(path: str, result: Dict[str, Any]) -> None:
    """Write ``result`` as JSON to ``path``."""
    Path(path).write_text(json.dumps(result, indent=1))

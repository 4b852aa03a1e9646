"""Run every benchmark, one after the other, and write the markdown report ``benchmarks/REPORT.md``.

Each benchmark runs as its own process (``OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE``; the 2-rank ones launch
their ranks themselves). Scripts with a ``--json PATH`` flag hand over their result directly (see ``results.py``);
for the others the printed tables are parsed here, and a section whose output cannot be parsed says so. Every
section also keeps the raw output, so nothing depends on the parsing alone.

Per benchmark the report gives the command, the baseline, the medians and ratios, the target and whether it was
met; its header states the date, the machine and the load on it (2 shared cores here: single runs vary by 2x and
more under load; every ratio is against a baseline measured in the same run). Under its summary a figure
(``REPORT.svg``, ``plot.py``) draws the training throughput of every variant, each run beside the medians.

Run (6-14 minutes on the 2-core machines of the reports, 3-8 of them the 100,000-step soak)::

    bash scripts/run-benchmarks                    # or: .venv/bin/python benchmarks/run_all.py
    .venv/bin/python benchmarks/run_all.py --smoke --report /tmp/REPORT.md   # tiny sizes: checks they all run
    .venv/bin/python benchmarks/run_all.py --only hash_fused key_value
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import plot
from results import make_result, target

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NUMBER = r"[-+]?\d+(?:\.\d+)?"
ENV = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


ID_MAP_TARGET = 100.0  # M IDs/s, later batches (issue 32)


class ParseError(ValueError):
    """A benchmark's output does not have the expected shape; the message says what was missing."""


def parse_id_map(text: str) -> Dict[str, Any]:
    """bench_id_map.py: first-batch and later-batch M IDs/s per contender (pandas' khash too when installed);
    target >= 100 M IDs/s (later)."""
    pattern = re.compile(rf"^(?P<name>\S.*?)\s+first batch\s+(?P<first>{NUMBER}) M IDs/s\s+later batches "
                         rf"\(median of (?P<n>\d+)\)\s+(?P<later>{NUMBER}) M IDs/s", re.M)
    found = {m["name"]: m for m in pattern.finditer(text)}
    if "IdMap (native)" not in found or "Python dict" not in found:
        raise ParseError("expected lines for 'IdMap (native)' and 'Python dict'")
    dict_rate = float(found["Python dict"]["later"])
    rows = [{"contender": name, "first batch M IDs/s": float(m["first"]), "later batches M IDs/s": float(m["later"]),
             "later batches": int(m["n"]), "vs dict": float(m["later"]) / dict_rate} for name, m in found.items()]
    lines = text.splitlines()
    noted = ("ratio IdMap / khash", "random reads")
    notes = lines[:1] + [line.strip() for line in lines if "skipped" in line or line.startswith(noted)]
    ours = float(found["IdMap (native)"]["later"])
    reads = next((line for line in notes if line.startswith("random reads")), None)  # the memory's bound, measured
    return make_result("IdMap.insert_or_lookup, Zipf(1.05) batches, one thread",
                       "a Python dict, same batches, same run", rows,
                       [target("IdMap later-batch M IDs/s", ours, ">=", ID_MAP_TARGET, bound=reads)], notes)


def parse_policies(text: str) -> Dict[str, Any]:
    """bench_policies.py: per-batch policy ms, eviction vs lru and admission vs count; no target in the script."""
    rows = []
    for kind, header in (("eviction", "vs lru"), ("admission", "vs count")):
        block = re.search(rf"^policy\s+ms/batch\s+{header}\n((?:\S+\s+{NUMBER}\s+{NUMBER}\n?)+)", text, re.M)
        if not block:
            raise ParseError(f"expected the {kind} table (header 'policy ms/batch {header}')")
        for line in block.group(1).splitlines():
            name, ms, ratio = line.split()
            rows.append({"kind": kind, "policy": name, "ms/batch": float(ms), "vs baseline": float(ratio),
                         "baseline": header[3:]})
    notes = [line for line in text.splitlines() if line.startswith(("eviction:", "admission:"))]
    notes.append("No target is stated for this micro-benchmark; bench_key_value.py measures the policy's share of a "
                 "KEY_VALUE training step against the 5% target.")
    return make_result("Eviction and admission policy time per batch (cache simulator)",
                       "LRU (eviction) and count (admission), same workload, same run", rows, [], notes)


def parse_stores(text: str) -> Dict[str, Any]:
    """bench_stores.py: ms/batch, rows/s and MB/s per scenario and op, x the in-memory baseline; no target."""
    pattern = re.compile(rf"^(?P<scenario>\S+)\s+(?P<op>put|get)\s+(?P<ms>{NUMBER})\s+(?P<mrows>{NUMBER})\s+"
                         rf"(?P<mbs>{NUMBER})\s+(?P<x>{NUMBER})$", re.M)
    rows = [{"scenario": m["scenario"], "op": m["op"], "ms/batch": float(m["ms"]), "M rows/s": float(m["mrows"]),
             "MB/s": float(m["mbs"]), "x baseline time": float(m["x"])} for m in pattern.finditer(text)]
    if not any(r["scenario"] == "host" for r in rows):
        raise ParseError("expected the table rows of the 'host' scenario")
    notes = [line for line in text.splitlines() if line.startswith(("rows=", "host+disk end state"))]
    notes.append("No target is stated; 'x baseline time' is store time / index_select or index_copy_ time on one "
                 "in-memory tensor (lower is better).")
    return make_result("KEY_VALUE row stores: put/get per batch, host only and host spilling to disk",
                       "index_select / index_copy_ on one in-memory tensor, same positions, same run", rows, [], notes)


def parse_pipeline(text: str) -> Dict[str, Any]:
    """bench_pipeline.py: steps/s, compute and cores busy per pipeline and depth; target depth 3 >= 1.3x depth 1
    where host >= 30%, bounded by the ceilings the script prints."""
    rows, targets, notes = [], [], []
    blocks = re.split(r"^(?=--device-ms )", text, flags=re.M)[1:]
    if not blocks:
        raise ParseError("expected blocks starting with '--device-ms'")
    variant = re.compile(rf"^\s*(?P<name>stock|depth \d+):\s+(?P<rate>{NUMBER}) steps/s \(runs: (?P<runs>[^)]*)\)"
                         rf"\s+vs depth \d+:\s+(?P<vs1>{NUMBER})x\s+vs stock:\s+(?P<vs_stock>{NUMBER})x"
                         rf"(?:\s+compute (?P<compute>{NUMBER}) ms of a {NUMBER} ms step,)?"
                         rf"\s+cores busy (?P<busy>{NUMBER})", re.M)
    for block in blocks:
        header = re.match(rf"--device-ms (?P<ms>{NUMBER}), rows (?P<layout>[^:]+):", block)
        if not header:
            raise ParseError("expected '--device-ms MS, rows LAYOUT:' at the start of each block")
        device_ms, layout = float(header["ms"]), header["layout"]
        setting = f"--device-ms {device_ms:g}, rows {layout}"
        host = re.search(rf"host stages {NUMBER} ms = (?P<share>\d+)% of a serial step", block)
        if not host:
            raise ParseError(f"{setting}: expected 'host stages ... % of a serial step'")
        share = int(host["share"])
        found = {m["name"]: m for m in variant.finditer(block)}
        for name, m in found.items():
            rows.append({"device ms": device_ms, "rows": layout, "host share %": share, "pipeline": name,
                         "steps/s": float(m["rate"]), "vs depth 1": float(m["vs1"]),
                         "vs stock": float(m["vs_stock"]),
                         "compute ms/step": float(m["compute"]) if m["compute"] else "-",  # stock: not timed
                         "cores busy": float(m["busy"]), "runs": m["runs"]})
        if "depth 3" not in found:
            notes.append(f"{setting}: no depth 3 run, so no target")
        elif share >= 30:
            ceilings = re.search(r"^\s*ceilings of depth 3: (.*)$", block, re.M)
            targets.append(target(f"depth 3 / depth 1 steps/s, {setting} (host {share}%)",
                                  float(found["depth 3"]["vs1"]), ">=", 1.3, bound=ceilings[1] if ceilings else None))
        else:
            notes.append(f"{setting}: host stages are {share}% of a serial step (< 30%), so the "
                         "1.3x target does not apply; ratios reported as measured.")
    notes += [line.strip() for line in text.splitlines() if line.startswith(("--device-ms", "  serial step"))]
    return make_result("HybridTrainPipelineSparseDist depths 1/3/6 vs TorchRec's TrainPipelineSparseDist, 2 ranks",
                       "depth 1 (every stage of a batch before the next) and stock TrainPipelineSparseDist, same run",
                       rows, targets, notes, throughput=("steps/s", ["pipeline", "device ms", "rows"]))


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A benchmark script, how it is run at full and at smoke size, and how its output becomes a result."""

    name: str
    script: str
    args: List[str]
    smoke_args: List[str]
    parse: Optional[Callable[[str], Dict[str, Any]]] = None  # None: the script writes JSON with --json

    def command(self, smoke: bool, json_path: Optional[str]) -> List[str]:
        args = self.smoke_args if smoke else self.args
        return [sys.executable, str(HERE / self.script), *args] + (["--json", json_path] if not self.parse else [])


# The soak's short form (CI, tests/benchmarks/test_soak.py): segments of 64 KiB, so compaction runs at this size.
SOAK_SHORT = ["--steps", "1500", "--checkpoints", "4", "--ids", "20000", "--batch", "128", "--cache-rows", "256",
              "--host-kb", "32", "--segment-mb", "0.0625"]

BENCHMARKS = [
    Benchmark("id_map", "bench_id_map.py", [],
              ["--batches", "2", "--dict-batches", "1", "--batch-size", "4096", "--capacity", "100000"],
              parse_id_map),
    Benchmark("policies", "bench_policies.py", [],
              ["--capacity", "2000", "--unique", "256", "--keys", "20000", "--batches", "6", "--warmup", "2"],
              parse_policies),
    Benchmark("stores", "bench_stores.py", [], ["--rows", "4096", "--batch", "512", "--repeats", "3"], parse_stores),
    Benchmark("pipeline", "bench_pipeline.py", [],
              ["--device-ms", "0", "--depths", "1", "3", "--runs", "1", "--steps", "3", "--warmup", "1",
               "--rows", "1000", "--batch", "32", "--ids-per-sample", "4", "--id-capacity", "4096"],
              parse_pipeline),
    Benchmark("hash_fused", "bench_hash_fused.py", ["--runs", "9", "--steps", "30"],
              ["--rows", "2000", "--catalogue", "1000", "--batch", "32", "--pool", "4", "--runs", "1", "--steps", "2",
               "--warmup", "1"]),
    Benchmark("checkpoint_paths", "bench_checkpoint_paths.py", ["--rows", "4000000"],
              ["--rows", "20000", "--dim", "16", "--reps", "1"]),
    Benchmark("soak", "bench_soak.py", ["--steps", "100000"], SOAK_SHORT),
    Benchmark("key_value", "bench_key_value.py", ["--runs", "7", "--steps", "30"],
              ["--catalogue", "100000", "--batch", "16", "--bag", "4", "--pool", "30", "--warmup", "2", "--runs",
               "1", "--steps", "2", "--policies", "lru", "ttl"]),
]


@dataclasses.dataclass
class Outcome:
    """What one benchmark run produced."""

    benchmark: Benchmark
    command: List[str]
    seconds: float
    returncode: int
    output: str
    result: Optional[Dict[str, Any]] = None
    error: str = ""


def run(benchmark: Benchmark, smoke: bool, timeout: float) -> Outcome:
    """Run ``benchmark`` and turn its output into a result (or an error saying why not)."""
    with tempfile.TemporaryDirectory(prefix="bench_") as tmp:
        json_path = str(Path(tmp) / "result.json")
        command = benchmark.command(smoke, json_path)
        start = time.perf_counter()
        try:
            proc = subprocess.run(command, cwd=ROOT, env={**os.environ, **ENV}, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as err:
            output = "\n".join(s.decode() if isinstance(s, bytes) else (s or "") for s in (err.stdout, err.stderr))
            return Outcome(benchmark, benchmark.command(smoke, "result.json"), time.perf_counter() - start, -1, output,
                           error=f"timed out after {timeout:.0f} s")
        shown = benchmark.command(smoke, "result.json")  # the command as the report shows it
        outcome = Outcome(benchmark, shown, time.perf_counter() - start, proc.returncode, proc.stdout)
        if proc.returncode != 0:
            outcome.output += "\n" + proc.stderr[-6000:]
            outcome.error = f"exited with status {proc.returncode}"
            return outcome
        try:
            outcome.result = (benchmark.parse(proc.stdout) if benchmark.parse
                              else json.loads(Path(json_path).read_text()))
        except (ParseError, OSError, ValueError, AttributeError) as err:
            outcome.error = f"could not read the result ({type(err).__name__}: {err})"
        return outcome


def fmt(value: Any) -> str:
    """A table cell: floats with 3 significant digits (at least 2 decimals below 10), others as they are."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) >= 10 else f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"
    return str(value).replace("|", "\\|")


def fmt_measured(t: Dict[str, Any]) -> str:
    """A target's measured value as :func:`fmt` writes it, with more digits where that would read as the threshold
    itself (0.9488 against >= 0.95 shows as 0.9488, not as a "0.95" that missed)."""
    if t["value"] is None:
        return "not measured"
    value, threshold = float(t["value"]), float(t["threshold"])
    text, digits = fmt(value), 3
    # 17 significant digits tell any two doubles apart, so the loop always ends with a figure that is not the bound.
    while value != threshold and float(text.replace(",", "")) == threshold and digits < 17:
        digits += 1
        text = f"{value:.{digits}g}"
    return text


def table(rows: List[Dict[str, Any]]) -> List[str]:
    """Markdown table of flat dicts; columns are the union of keys, in first-seen order."""
    columns: List[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row.get(c, "")) for c in columns) + " |" for row in rows]
    return lines


def shell(command: List[str]) -> str:
    """The command as one would type it from the repository root."""
    parts = [str(Path(p).relative_to(ROOT)) if p.startswith(str(ROOT)) else p for p in command[1:]]
    return " ".join(["OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python", *parts])


def machine() -> List[str]:
    """Lines describing where and with what the benchmarks ran."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal"))
        memory = f"{mem_kb / 1024**2:.0f} GiB"
    except (OSError, StopIteration):
        memory = "unknown"
    versions = []
    for dist in ("torch", "torchrec", "fbgemm-gpu-cpu", "torchrec-ascend"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
    return [
        f"- Machine: {cpu}, {os.cpu_count()} cores, {memory} memory, {platform.system()} {platform.release()}; "
        "no accelerator (CPU kernels, gloo collectives)",
        f"- Software: Python {platform.python_version()}, {', '.join(versions)}; commit "
        f"{commit.stdout.strip() or 'unknown'}" + (" with uncommitted changes in the working tree" if changed else ""),
    ]


def load() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def figure(outcomes: List[Outcome], path: Path) -> List[str]:
    """Draw the training throughput of the benchmarks that measure it into ``path`` (``plot.py``); returns the
    report's lines that show it, or that say why there is none (no such benchmark ran: no lines, no file)."""
    try:
        drawn = (plot.panel(o.benchmark.name, o.result) for o in outcomes if o.result)
        panels = [p for p in drawn if p is not None]
    except ValueError as err:
        return ["", f"**No figure: {err}.**"]
    if not panels:
        path.unlink(missing_ok=True)  # a figure of an earlier run would not match this report
        return []
    try:
        plot.draw(panels, str(path))
    except ImportError:
        return ["", "**No figure: matplotlib is not installed** (`pip install matplotlib`; "
                "`bash scripts/run-benchmarks` installs it)."]
    return ["", f"![training throughput per variant]({path.name})", "",
            f"Training throughput per variant (`{path.name}`): bars are the medians in the tables below, dots the "
            "single runs. The hash FUSED and KEY_VALUE ratios are not ratios of two bars: each is the median of the "
            "ratios of runs paired in a round (a round's variants run back to back, under the same load)."]


def report(outcomes: List[Outcome], smoke: bool, started: datetime.datetime, load_before: str,
           setting: List[str], figure_lines: List[str]) -> str:
    """The markdown report; ``setting``: :func:`machine`'s lines, taken when the run started (the code that ran);
    ``figure_lines``: :func:`figure`'s, shown under the summary."""
    total = sum(o.seconds for o in outcomes)
    lines = [
        "# Benchmark report",
        "",
        f"Written by `benchmarks/run_all.py{' --smoke' if smoke else ''}` (`bash scripts/run-benchmarks`) on "
        f"{started:%Y-%m-%d %H:%M} UTC; {len(outcomes)} benchmark(s) in {total / 60:.1f} minutes.",
        "",
        *setting,
        f"- Load average (1/5/15 min) before: {load_before}; after: {load()}. The machine is shared: other jobs "
        "ran on its 2 cores meanwhile, so single runs vary by 2x and more (see the runs columns). Every ratio below is "
        "against a baseline measured in the same run (interleaved with it where the benchmark says so), and every "
        "figure is a median over repeats.",
    ]
    if smoke:
        lines.append("- **Smoke run: tiny sizes, the numbers mean nothing; this only shows every benchmark runs.**")
    lines += ["", "## Summary", "", "| benchmark | target | measured | met |", "|---|---|---|---|"]
    for o in outcomes:
        targets = (o.result or {}).get("targets", [])
        if o.error:
            lines.append(f"| {o.benchmark.name} | | **{o.error}** | no |")
        elif not targets:
            lines.append(f"| {o.benchmark.name} | none stated | see below | - |")
        for t in targets if not o.error else []:
            lines.append(f"| {o.benchmark.name}: {t['what']} | {t['target']} | {fmt_measured(t)} | "
                         f"{'yes' if t['met'] else '**no**'} |")
    lines += figure_lines
    for o in outcomes:
        lines += ["", f"## {o.benchmark.name} (`benchmarks/{o.benchmark.script}`)", "",
                  f"Command ({o.seconds:.0f} s):", "", "```", shell(o.command), "```", ""]
        if o.error:
            lines += [f"**Failed: {o.error}.** The raw output below says why.", ""]
        if o.result:
            r = o.result
            lines += [f"{r['title']}.", "", f"Baseline: {r['baseline']}.", "", *table(r["rows"]), ""]
            lines += [f"- {note}" for note in r["notes"]]
            for t in r["targets"]:
                lines.append(f"- Target: {t['what']} {t['target']}: measured {fmt_measured(t)}, "
                             f"{'met' if t['met'] else '**not met**'}."
                             + (f" What bounds it on this machine: {t['bound']}." if t.get("bound") and not t["met"]
                                else ""))
        lines += ["", "<details><summary>raw output</summary>", "", "```", o.output.strip(), "```", "", "</details>"]
    return "\n".join(lines) + "\n"


# sections of benchmarks run on their own (bench_scale.py, bench_key_index.py, bench_disk_reads.py): kept across runs
STANDALONE = ("## Scale:", "## Key index:", "## Disk reads:")


def standalone_sections(path: str) -> str:
    """The sections of the report at ``path`` written by standalone benchmarks (see ``STANDALONE``), to carry over."""
    old = Path(path).read_text() if Path(path).exists() else ""
    kept = []
    for header in STANDALONE:
        start = old.find("\n" + header)
        if start >= 0:
            end = old.find("\n## ", start + 1)
            kept.append(old[start : end if end >= 0 else len(old)].rstrip("\n") + "\n")
    return "".join(kept)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmarks, write the report; exit status 1 if any benchmark failed to run (not on missed targets)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", default=str(HERE / "REPORT.md"), help="where to write the markdown report")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: check every benchmark runs (numbers void)")
    parser.add_argument("--only", nargs="+", choices=[b.name for b in BENCHMARKS], help="run only these")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per benchmark (default 900, smoke 300)")
    args = parser.parse_args(argv)
    timeout = args.timeout or (300.0 if args.smoke else 900.0)
    started, load_before, setting = datetime.datetime.now(datetime.timezone.utc), load(), machine()
    outcomes = []
    for benchmark in BENCHMARKS:
        if args.only and benchmark.name not in args.only:
            continue
        print(f"running {benchmark.name} ...", flush=True)
        outcome = run(benchmark, args.smoke, timeout)
        print(f"  {outcome.seconds:.0f} s" + (f": {outcome.error}" if outcome.error else ""), flush=True)
        outcomes.append(outcome)
    kept = standalone_sections(args.report)
    figure_lines = figure(outcomes, Path(args.report).with_suffix(".svg"))
    Path(args.report).write_text(report(outcomes, args.smoke, started, load_before, setting, figure_lines) + kept)
    print(f"wrote {args.report}")
    return 1 if any(o.error for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())

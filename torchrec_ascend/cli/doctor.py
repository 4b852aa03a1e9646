"""``torchrec-ascend doctor``: versions and the supported stack they match, the selected device backend, every patch
with its state and whether its target is the reviewed source (drift), every adapter (the TorchRec private names
used outside the patches) with its state, plugins, errors.

The report fits 100 columns (tracebacks aside). The exit status is 1 when torchrec-ascend is not working as
installed: autoloading failed, ``import torchrec`` failed, a plugin failed to load, a patch failed or was skipped,
or an adapter is unsupported or misses a private name;
0 otherwise (also when it was switched off on purpose).

Example::

    $ torchrec-ascend doctor
    $ echo $?   # 0: everything applied
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import textwrap
from typing import Any, List, Mapping, Optional

from torchrec_ascend import hooks
from torchrec_ascend import versions as version_table
from torchrec_ascend.adapters.requirements import installed_distribution, installed_version, version_problem
from torchrec_ascend.injection import autoload, drift, install_problems
from torchrec_ascend.injection.patch import Patch
from torchrec_ascend.injection.registry import PatchState

WIDTH = 100
_DISTRIBUTIONS = ("torchrec-ascend", "torch", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu", "torch-npu", "fbgemm-ascend")
_INDENT = " " * 11  # under a patch's name, past its state column
_ADAPTER_INDENT = " " * 14  # under an adapter's name


@dataclasses.dataclass
class Diagnosis:
    """The doctor's findings.

    Attributes:
        text: the report, one line per entry, at most :data:`WIDTH` columns (tracebacks aside).
        problems: one line per problem that makes ``doctor`` exit with status 1 (empty: healthy).
    """

    text: str
    problems: List[str]


def _wrap(text: str, indent: str) -> List[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)


def diagnose() -> Diagnosis:
    """Examine this process: import torchrec (which applies the patches if autoloading is on), then report.

    Patches whose target module torchrec has not imported yet are applied now (their modules are imported), so
    every patch shows whether it applies.

    Example::

        diagnosis = diagnose()
        print(diagnosis.text)
        assert not diagnosis.problems
    """
    problems: List[str] = []
    lines: List[str] = ["torchrec-ascend doctor", "", "Versions:", f"  {'python':<17} {platform.python_version()}"]
    for dist in _DISTRIBUTIONS:
        version = installed_version(dist)
        if version is not None or dist in ("torch", "torchrec"):
            lines.append(f"  {dist:<17} {version or 'not installed'}")
    lines += _stack_lines(installed_version("torchrec"))
    lines += _native_lines(problems)

    try:
        import torchrec  # noqa: F401  (triggers the import hook: registry, backend, patches)

        registry = autoload.registry()
        if registry is not None:
            registry.apply()  # import the targets torchrec itself has not imported yet
    except Exception as err:  # a broken accelerator stack raises here: show it, do not crash
        problems.append(f"import torchrec failed: {type(err).__name__}: {err}")
        fix = install_problems.explain(err)
        if fix:
            problems.append(fix)

    status = autoload.STATUS
    lines += ["", f"Autoload: {status.state}" + (f" ({status.detail})" if status.detail else "")]
    if status.state == "error":
        problems.append(f"autoload: {status.detail}")
    lines += _backend_lines(problems)
    lines += _patch_lines(problems)
    lines += _adapter_lines(problems)
    lines += _plugin_lines(problems)
    errors = problems + status.errors
    lines += ["", "Errors:" if errors else "Errors: none"]
    for error in errors:
        for line in error.rstrip().splitlines():
            lines += _wrap(line, "  ") if not line.startswith(" ") else [f"  {line}"]
    return Diagnosis("\n".join(lines), problems)


def report() -> str:
    """The doctor report as text (see :func:`diagnose`)."""
    return diagnose().text


def _backend_lines(problems: List[str]) -> List[str]:
    from torchrec_ascend import backends

    selection = backends.selection_status()
    lines = ["", f"Device backend: {selection.selected or '(not activated)'} (requested: {selection.requested})"]
    if selection.detail:
        lines += _wrap(selection.detail, "  ")
    try:
        for name, profile in sorted(backends.profiles().items()):
            present = "present" if profile.detect() else "absent"
            lines += _wrap(f"{name:<6} {present:<8} {profile.collective_backend:<6} {profile.description}", "  ")
    except Exception as err:
        problems.append(f"listing backends failed: {type(err).__name__}: {err}")
    if selection.selected:
        lines += _device_op_lines(backends.profile_for(selection.selected) or backends.active())
    return lines


def _device_op_lines(profile: Any) -> List[str]:
    """The active backend's optional kernel libraries (loaded, or the import error) and each fbgemm op it calls."""
    from torchrec_ascend.hooks import sparse_ops

    rows = sparse_ops.op_coverage(profile)
    if not rows and not profile.optional_op_modules:
        return []
    lines = ["", f"Device ops ({profile.name}):"]
    for module in profile.optional_op_modules:
        library = sparse_ops.LIBRARIES.get(module)
        state = "not tried" if library is None else f"NOT LOADED: {library.error}" if library.error else "loaded"
        lines += _wrap(f"{module:<17} {state}", "  ")
    calls = sparse_ops.fallback_calls()
    tbe = {f"fbgemm::{n}" for n in profile.device_tbe_ops}
    for op, state in rows:
        if state == "host fallback":
            state += f" ({calls.get(op, 0)} calls)"
        elif state == "no kernel" and op in tbe:
            state = "no kernel: device planning refused"
        lines += _wrap(f"{op.partition('::')[2]:<55} {state}", "  ")
    return lines


def _native_lines(problems: List[str]) -> List[str]:
    """Whether the native ops library loads, and the torch it was built for (or why it does not load)."""
    from torchrec_ascend.native import library

    problem = library.problem()
    if problem is not None:
        problems.append(problem)
        return ["", "Native ops: NOT LOADED (see Errors)"]
    built = library.built_for()
    return ["", f"Native ops: loaded ({f'built for torch {built}' if built else 'source build'})"]


def _stack_lines(torchrec_version: Optional[str]) -> List[str]:
    """The version-table row matching the installed TorchRec (or why none does)."""
    if torchrec_version is None:
        return ["", "Supported stack: none (torchrec is not installed)"]
    row = version_table.stack_for(torchrec_version)
    if row is None:
        where = "newer" if version_table.newer_than_table(torchrec_version) else "older"
        rows = ", ".join(s.torchrec for s in version_table.STACKS)
        lines = ["", f"Supported stack: none (torchrec {torchrec_version} is {where} than the table: {rows})"]
        if where == "newer":
            lines += _wrap("patches apply only where their target matches a reviewed source", "  ")
        return lines
    lane = f"CI lane {row.lane}" if row.ci else f"lane {row.lane}, not run in CI"
    return [
        "",
        f"Supported stack: torchrec {row.torchrec} (reviewed {row.reviewed}; {lane})",
        f"  pairs with torch {row.torch}, fbgemm-gpu(-cpu) {row.fbgemm}, torch-npu {row.torch_npu}",
    ]


def _drift_line(patch: Patch, reviewed: Mapping[str, str], admitted: str, version: str) -> str:
    found = drift.check(patch, reviewed, version)
    if found.state == "reviewed":
        outside = "; outside its range, applied on this reviewed source" if admitted else ""
        return f"source {found.digest} = reviewed on torchrec {found.matched}{outside}"
    if found.state == "missing":
        return f"source NOT FOUND ({found.detail})"
    if found.state == "unreviewed":
        return f"source {found.digest} DRIFTED: no reviewed digest recorded (hooks/reviewed.py)"
    known = ", ".join(f"{v} {d}" for v, d in reviewed.items() if not version or v == version) or "none"
    return f"source {found.digest} DRIFTED: not the reviewed source (reviewed: {known})"


def _requirement_lines(requirements: dict) -> List[str]:
    lines = ["", "Patch requirements:"]
    for dist, spec in requirements.items():
        found = installed_distribution(dist)
        have = f"{found[0]} {found[1]}" if found else "not installed"
        verdict = "ok" if version_problem({dist: spec}, {dist: found[1] if found else None}) is None else "UNSUPPORTED"
        lines += _wrap(f"{dist:<26} {spec:<14} {have:<26} {verdict}", "  ")
    return lines


def _patch_lines(problems: List[str]) -> List[str]:
    registry = autoload.registry()
    if registry is None:
        return ["", "Patches: none (torchrec-ascend is not active in this process)"]
    statuses = registry.report()
    lines = _requirement_lines(registry.requirements())
    counts = {state: sum(s.state is state for s in statuses) for state in PatchState}
    summary = ", ".join(f"{n} {state.value}" for state, n in counts.items() if n)
    lines += ["", f"Patches ({summary}):"]
    drifted = []
    torchrec_version = installed_version("torchrec")
    row = version_table.stack_for(torchrec_version) if torchrec_version else None
    compare_with = row.reviewed if row else ""  # within the table: that row's release; newer: any reviewed
    registrations = {p.name for p in hooks.registrations()}
    for status in statuses:
        patch = status.patch
        requires = ", ".join(patch.requires) or "any version"
        lines += _wrap(f"{status.state.value:<8} {patch.name}  [requires {requires}]", "  ")
        lines += _target_lines(patch.target)
        if patch.name in registrations:  # H6: registrations on the op dispatcher
            line = "not TorchRec source: nothing to review for drift"
        else:
            line = _drift_line(patch, registry.reviewed.get(patch.name, {}), status.admitted, compare_with)
        lines += _wrap(line, _INDENT)
        if "DRIFTED" in line:
            drifted.append(patch.name)
        lines += _wrap(patch.reason, _INDENT)
        if status.detail:
            lines += _wrap(f"-> {status.detail}", _INDENT)
        if status.state is PatchState.FAILED:
            problems.append(f"patch {patch.name} failed: {status.detail}")
    if counts[PatchState.SKIPPED]:
        reasons = sorted({s.detail for s in statuses if s.state is PatchState.SKIPPED})
        problems.append(f"{counts[PatchState.SKIPPED]} patches skipped: {'; '.join(reasons)}")
    if drifted:
        lines += _wrap(f"Targets not the reviewed source ({len(drifted)}): {', '.join(drifted)}", "  ")
    return lines


def _target_lines(target: str, indent: str = _INDENT) -> List[str]:
    if len(indent) + len(target) <= WIDTH:
        return [indent + target]
    module, _, qualname = target.partition(":")
    return [f"{indent}{module}:", f"{indent}  {qualname}"]


def _adapter_lines(problems: List[str]) -> List[str]:
    """Each adapter (the TorchRec private names touched outside the patches): state, range, target, reason."""
    from torchrec_ascend import adapters

    try:
        statuses = adapters.report()
    except Exception as err:  # an adapter module fails to import on this TorchRec: show it, do not crash
        problems.append(f"checking adapters failed: {type(err).__name__}: {err}")
        return []
    counts = {state: sum(s.state == state for s in statuses) for state in ("supported", "unsupported", "missing")}
    summary = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
    lines = ["", f"Adapters ({summary}):"]
    for status in statuses:
        adapter = status.adapter
        ranges = ", ".join(f"{dist} {spec}" for dist, spec in adapter.requires.items())
        lines += _wrap(f"{status.state:<11} {adapter.name}  [{ranges}]", "  ")
        lines += _target_lines(adapter.target, _ADAPTER_INDENT)
        lines += _wrap(f"{len(adapter.privates)} private names; {adapter.reason}", _ADAPTER_INDENT)
        if status.detail:
            lines += _wrap(f"-> {status.detail}", _ADAPTER_INDENT)
            problems.append(f"adapter {adapter.name} {status.state}: {status.detail}")
    return lines


def _plugin_lines(problems: List[str]) -> List[str]:
    from torchrec_ascend.plugin_manager import get_plugin_manager

    lines = ["", "Plugins (entry-point group torchrec_ascend):"]
    try:
        for info in get_plugin_manager().plugins():
            lines += _wrap(f"{info.name:<22} {info.distribution} {info.version}  ({info.module})", "  ")
    except Exception as err:
        problems.append(f"loading plugins failed: {type(err).__name__}: {err}")
    return lines


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``doctor`` subcommand."""
    parser = subparsers.add_parser("doctor", help="show versions, backend, patches, plugins and errors")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the report; return 1 if it found a problem, else 0."""
    diagnosis = diagnose()
    print(diagnosis.text)
    return 1 if diagnosis.problems else 0

"""``torchrec-ascend doctor``: versions, the selected device backend, every patch and its state, plugins, errors.

Example::

    $ torchrec-ascend doctor
"""

from __future__ import annotations

import argparse
import platform
from typing import List

from torchrec_ascend.injection import autoload
from torchrec_ascend.injection.registry import installed_version

_DISTRIBUTIONS = ("torchrec-ascend", "torch", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu", "torch-npu", "fbgemm-ascend")


def report() -> str:
    """The doctor report as text (importing torchrec, which applies the patches if autoloading is on)."""
    lines: List[str] = ["torchrec-ascend doctor", "", "Versions:"]
    lines.append(f"  python            {platform.python_version()}")
    for dist in _DISTRIBUTIONS:
        version = installed_version(dist)
        if version is not None or dist in ("torch", "torchrec"):
            lines.append(f"  {dist:<17} {version or 'not installed'}")

    errors: List[str] = []
    try:
        import torchrec  # noqa: F401  (triggers the import hook: registry, backend, patches)
    except Exception as err:  # a broken accelerator stack raises here: show it, do not crash
        errors.append(f"import torchrec failed: {type(err).__name__}: {err}")

    status = autoload.STATUS
    lines += ["", f"Autoload: {status.state}" + (f" ({status.detail})" if status.detail else "")]
    lines += _backend_lines(errors)
    lines += _patch_lines()
    lines += _plugin_lines(errors)
    errors += status.errors
    lines += ["", "Errors:" if errors else "Errors: none"]
    lines += [f"  {line}" for err in errors for line in err.rstrip().splitlines()]
    return "\n".join(lines)


def _backend_lines(errors: List[str]) -> List[str]:
    from torchrec_ascend import backends
    from torchrec_ascend.hooks import sparse_ops

    selection = backends.selection_status()
    lines = ["", f"Device backend: {selection.selected or '(not activated)'} (requested: {selection.requested})"]
    if selection.detail:
        lines.append(f"  {selection.detail}")
    try:
        for name, profile in sorted(backends.profiles().items()):
            present = "present" if profile.detect() else "absent"
            lines.append(f"  {name:<6} {present:<8} {profile.collective_backend:<6} {profile.description}")
    except Exception as err:
        errors.append(f"listing backends failed: {type(err).__name__}: {err}")
    if sparse_ops.REGISTERED:
        lines.append(f"  ops served by a host round trip: {', '.join(sparse_ops.REGISTERED)}")
    return lines


def _patch_lines() -> List[str]:
    registry = autoload.registry()
    if registry is None:
        return ["", "Patches: none (torchrec-ascend is not active in this process)"]
    lines = ["", "Patches:"]
    for status in registry.report():
        patch = status.patch
        requires = ", ".join(f"{d}{s}" for d, s in patch.requires.items())
        lines.append(f"  {status.state.value:<8} {patch.name:<34} {patch.target}")
        lines.append(f"  {'':<8} {'':<34} supports {requires}; {patch.reason}")
        if status.detail:
            lines.append(f"  {'':<8} {'':<34} -> {status.detail}")
    return lines


def _plugin_lines(errors: List[str]) -> List[str]:
    from torchrec_ascend.plugin_manager import get_plugin_manager

    lines = ["", "Plugins (entry-point group torchrec_ascend):"]
    try:
        for info in get_plugin_manager().plugins():
            lines.append(f"  {info.name:<22} {info.distribution} {info.version}  ({info.module})")
    except Exception as err:
        errors.append(f"loading plugins failed: {type(err).__name__}: {err}")
    return lines


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("doctor", help="show versions, backend, patches, plugins and errors")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    text = report()
    print(text)
    registry = autoload.registry()
    failed = registry is not None and any(s.state.value == "failed" for s in registry.report())
    return 1 if failed or autoload.STATUS.state == "error" else 0

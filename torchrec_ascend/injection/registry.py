"""PatchRegistry: applies a declared, ordered set of patches once each, reverts any subset, reports every state.

The registry is all-or-nothing per installed version: if the installed TorchRec (or another required
distribution) is outside any patch's supported range, nothing is applied, one warning lists every patch skipped
and why, and TorchRec is left untouched. A patch that fails while applying reverts the ones already applied.

Example::

    with PatchRegistry([patch_a, patch_b]) as registry:   # applies both (modules imported as needed)
        ...
    # both reverted here
    print(registry.report())
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.metadata
import sys
import warnings
from typing import Dict, Iterable, List, Optional

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchrec_ascend.injection.patch import Patch, Undo


class PatchState(str, enum.Enum):
    PENDING = "pending"  # waiting for its target module to be imported
    APPLIED = "applied"
    SKIPPED = "skipped"
    FAILED = "failed"
    REVERTED = "reverted"


@dataclasses.dataclass
class PatchStatus:
    patch: Patch
    state: PatchState = PatchState.PENDING
    detail: str = ""


def installed_version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_problem(requires: Dict[str, str], versions: Dict[str, Optional[str]]) -> Optional[str]:
    """Why ``requires`` is not met by ``versions`` (distribution -> installed version), or None."""
    for dist, spec in requires.items():
        have = versions.get(dist)
        if have is None:
            return f"{dist} is not installed (needs {spec})"
        if Version(have) not in SpecifierSet(spec, prereleases=True):
            return f"{dist} {have} is outside the supported range {spec}"
    return None


def _fully_imported(module: str) -> bool:
    """True if ``module`` finished executing (a module mid-import may lack the names a patch resolves)."""
    mod = sys.modules.get(module)
    return mod is not None and not getattr(getattr(mod, "__spec__", None), "_initializing", False)


class PatchRegistry:
    """An ordered set of uniquely named patches and the state of each.

    Args:
        patches: the patches, in the order they must be applied.
        versions: distribution -> installed version, to check ``Patch.requires`` against (default: read from the
            installed distributions).
    """

    def __init__(self, patches: Iterable[Patch] = (), versions: Optional[Dict[str, Optional[str]]] = None) -> None:
        self._status: Dict[str, PatchStatus] = {}
        self._undo: Dict[str, Undo] = {}
        self._versions = versions
        self._version_checked = False
        for patch in patches:
            self.add(patch)

    def add(self, patch: Patch) -> None:
        if patch.name in self._status:
            raise ValueError(f"a patch named {patch.name!r} is already registered (targets {patch.target})")
        self._status[patch.name] = PatchStatus(patch)

    @property
    def patches(self) -> List[Patch]:
        return [s.patch for s in self._status.values()]

    def watched_modules(self) -> set:
        """Modules whose import should trigger :meth:`apply` (targets of pending patches)."""
        return {s.patch.module for s in self._status.values() if s.state is PatchState.PENDING}

    def apply(self, loaded_module: Optional[str] = None) -> None:
        """Apply, in declared order, every pending patch whose target module is imported (or is ``loaded_module``).

        With neither, imports every target module (used by tests and explicit activation).
        """
        if not self._check_versions():
            return
        for name, status in self._status.items():
            if status.state is not PatchState.PENDING:
                continue
            module = status.patch.module
            if loaded_module is not None and module != loaded_module and not _fully_imported(module):
                continue
            try:
                self._undo[name] = status.patch.apply()
            except Exception as err:
                status.state, status.detail = PatchState.FAILED, f"{type(err).__name__}: {err}"
                self._abort(f"patch {name!r} failed")
                warnings.warn(
                    f"torchrec-ascend: patch {name!r} ({status.patch.target}) failed: {status.detail}. All "
                    "patches were reverted; TorchRec runs unmodified. Run `torchrec-ascend doctor` for details.",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return
            status.state, status.detail = PatchState.APPLIED, ""

    def revert(self, names: Optional[Iterable[str]] = None) -> None:
        """Undo the applied patches named (default: all), last applied first."""
        wanted = set(self._status) if names is None else set(names)
        for name in reversed(list(self._undo)):
            if name in wanted:
                self._undo.pop(name)()
                self._status[name].state = PatchState.REVERTED

    def status(self, name: str) -> PatchStatus:
        return self._status[name]

    def report(self) -> List[PatchStatus]:
        return list(self._status.values())

    def __enter__(self) -> "PatchRegistry":
        self.apply()
        return self

    def __exit__(self, *exc: object) -> None:
        self.revert()

    def _abort(self, why: str) -> None:
        self.revert()
        for status in self._status.values():
            if status.state in (PatchState.PENDING, PatchState.REVERTED):
                status.state, status.detail = PatchState.SKIPPED, why

    def _check_versions(self) -> bool:
        if self._version_checked:
            return not any(s.state is PatchState.SKIPPED for s in self._status.values())
        self._version_checked = True
        dists = {d for s in self._status.values() for d in s.patch.requires}
        versions = self._versions if self._versions is not None else {d: installed_version(d) for d in dists}
        problems = {n: version_problem(dict(s.patch.requires), versions) for n, s in self._status.items()}
        problems = {n: p for n, p in problems.items() if p}
        if not problems:
            return True
        for name, status in self._status.items():
            status.state = PatchState.SKIPPED
            status.detail = problems.get(name) or "skipped with the others: the installed versions are unsupported"
        listing = "\n".join(f"  - {n}: {p}" for n, p in problems.items())
        skipped = ", ".join(self._status)
        found = ", ".join(f"{d} {v}" for d, v in sorted(versions.items()))
        warnings.warn(
            f"torchrec-ascend: unsupported versions ({found}); no patch applied, TorchRec is left untouched.\n"
            f"{listing}\nSkipped: {skipped}. Install the tested stack (torchrec 1.8.0, fbgemm-gpu-cpu 1.8.0, "
            "torch 2.13.0) or a torchrec-ascend release that supports your versions.",
            RuntimeWarning,
            stacklevel=3,
        )
        return False

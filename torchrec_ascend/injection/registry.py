"""PatchRegistry: applies a declared, ordered set of patches once each, reverts any subset, reports every state.

Each patch is gated on its own declared versions (``Patch.requires``):

* inside its range, it applies;
* NEWER than its range (e.g. a TorchRec minor released after this torchrec-ascend), it applies only if its target's
  installed source is one that was reviewed (its digest is among the patch's reviewed digests, see
  :mod:`~torchrec_ascend.injection.drift`); otherwise it is skipped, naming the target and why;
* older than its range, or a required distribution not installed: skipped.

One warning lists every patch skipped or admitted on its digest (issued once). A patch that fails while applying
reverts the ones already applied and marks the rest skipped.

Example::

    with PatchRegistry([patch_a, patch_b]) as registry:   # applies both (modules imported as needed)
        ...
    # both reverted here
    print(registry.report())
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import warnings
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchrec_ascend.adapters.requirements import installed_distribution, newer_than, version_problem
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.injection import drift
from torchrec_ascend.injection.patch import Patch, Undo


class PatchState(str, enum.Enum):
    """Where a patch stands."""

    PENDING = "pending"  # waiting for its target module to be imported
    APPLIED = "applied"
    SKIPPED = "skipped"  # unsupported versions, a drifted target outside its range, or another patch failed
    FAILED = "failed"
    REVERTED = "reverted"


@dataclasses.dataclass
class PatchStatus:
    """A patch, its state and why (``detail``: the version problem, the error, or empty).

    ``admitted`` is the reviewed TorchRec version whose source the target matched, for a patch applied outside its
    declared range ('' otherwise).
    """

    patch: Patch
    state: PatchState = PatchState.PENDING
    detail: str = ""
    admitted: str = ""


def _only_newer(requires: Mapping[str, str], versions: Mapping[str, Optional[str]]) -> bool:
    """True if every requirement ``versions`` misses is missed by being newer than its range."""
    failing = [
        (versions.get(d), spec)
        for d, spec in requires.items()
        if (have := versions.get(d)) is None or Version(have) not in SpecifierSet(spec, prereleases=True)
    ]
    return bool(failing) and all(have is not None and newer_than(have, spec) for have, spec in failing)


def fully_imported(module: str) -> bool:
    """True if ``module`` finished executing (a module mid-import may lack the names a patch resolves)."""
    mod = sys.modules.get(module)
    return mod is not None and not getattr(getattr(mod, "__spec__", None), "_initializing", False)


class PatchRegistry:
    """An ordered set of uniquely named patches and the state of each.

    Args:
        patches: the patches, in the order they must be applied.
        versions: ``requires`` key -> installed version, to check ``Patch.requires`` against (default: read from
            the installed distributions).
        reviewed: patch name -> {reviewed TorchRec version -> digest of its target's source}: what a patch newer
            than its range must match to be applied (default: nothing reviewed, so such patches are skipped).

    Raises:
        ConfigError: two patches share a name.

    Example::

        registry = PatchRegistry(hooks.default_patches())
        registry.apply()                                 # imports the targets, applies in declared order
        registry.revert(["h4.comm_record_stream"])       # any subset
    """

    def __init__(
        self,
        patches: Iterable[Patch] = (),
        versions: Optional[Mapping[str, Optional[str]]] = None,
        reviewed: Optional[Mapping[str, Mapping[str, str]]] = None,
    ) -> None:
        self._status: Dict[str, PatchStatus] = {}
        self._undo: Dict[str, Undo] = {}
        self._versions = versions
        self.reviewed: Mapping[str, Mapping[str, str]] = reviewed or {}
        self._version_checked = False
        for patch in patches:
            self.add(patch)

    def add(self, patch: Patch) -> None:
        """Append ``patch`` to the declared order.

        Raises:
            ConfigError: a patch of that name is already registered.
        """
        if patch.name in self._status:
            raise ConfigError(
                f"a patch named {patch.name!r} is already registered (targets "
                f"{self._status[patch.name].patch.target}); give the patch for {patch.target} its own name"
            )
        self._status[patch.name] = PatchStatus(patch)

    @property
    def patches(self) -> List[Patch]:
        """The patches in declared order."""
        return [s.patch for s in self._status.values()]

    def watched_modules(self) -> set:
        """Modules whose import should trigger :meth:`apply` (targets of pending patches)."""
        return {s.patch.module for s in self._status.values() if s.state is PatchState.PENDING}

    def requirements(self) -> Dict[str, str]:
        """Every ``requires`` key of the patches -> the specifiers asked for it (joined when they differ)."""
        found: Dict[str, List[str]] = {}
        for status in self._status.values():
            for dist, spec in status.patch.requires.items():
                if spec not in found.setdefault(dist, []):
                    found[dist].append(spec)
        return {dist: " and ".join(specs) for dist, specs in found.items()}

    def apply(self, loaded_module: Optional[str] = None) -> None:
        """Apply, in declared order, every pending patch whose target module is imported (or is ``loaded_module``).

        With neither, imports every target module (tests, ``doctor`` and explicit activation do this). Patches
        the version gate skipped stay skipped (see the module docstring). A patch that raises marks itself failed,
        reverts every applied patch and marks the others skipped; a warning says so (nothing is raised: TorchRec
        then runs unmodified).
        """
        self._check_versions()
        for name, status in self._status.items():
            if status.state is not PatchState.PENDING:
                continue
            module = status.patch.module
            if loaded_module is not None and module != loaded_module and not fully_imported(module):
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
        """Undo the applied patches named (default: all), last applied first.

        Raises:
            ConfigError: a name is not registered, or a patch would be reverted from under a later applied patch of
                the same target that stays applied (its undo would silently drop that patch too); revert both, or the
                later one first.
        """
        wanted = set(self._status) if names is None else set(names)
        unknown = wanted - set(self._status)
        if unknown:
            raise ConfigError(
                f"revert: no patch named {', '.join(sorted(unknown))}; name registered patches: "
                f"{', '.join(self._status)}"
            )
        order = list(self._undo)
        for i, name in enumerate(order):
            target = self._status[name].patch.target
            above = [n for n in order[i + 1 :] if n not in wanted and self._status[n].patch.target == target]
            if name in wanted and above:
                raise ConfigError(
                    f"cannot revert {name!r} alone: {', '.join(above)} patched {target} after it and stays "
                    "applied; revert them together"
                )
        for name in reversed(order):
            if name in wanted:
                self._undo.pop(name)()
                self._status[name].state = PatchState.REVERTED

    def status(self, name: str) -> PatchStatus:
        """The status of the patch named ``name`` (KeyError if there is none)."""
        return self._status[name]

    def report(self) -> List[PatchStatus]:
        """Every patch's status, in declared order."""
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

    def _installed(self) -> Tuple[Dict[str, Optional[str]], Dict[str, str]]:
        """``requires`` key -> installed version, and -> how to name what was found in messages."""
        keys = {d for s in self._status.values() for d in s.patch.requires}
        if self._versions is not None:
            return dict(self._versions), {k: k for k in keys}
        found = {k: installed_distribution(k) for k in keys}
        return {k: f[1] if f else None for k, f in found.items()}, {k: f[0] if f else k for k, f in found.items()}

    def _check_versions(self) -> None:
        """Gate every patch on its versions once (the first ``apply``); warn once if any is skipped or admitted."""
        if self._version_checked:
            return
        self._version_checked = True
        versions, names = self._installed()
        skipped: Dict[str, str] = {}
        admitted: Dict[str, str] = {}
        for name, status in self._status.items():
            problem = version_problem(status.patch.requires, versions)
            if problem is None:
                continue
            if _only_newer(status.patch.requires, versions):
                found = drift.check(status.patch, self.reviewed.get(name))
                if found.state == "reviewed":
                    status.admitted = found.matched
                    admitted[name] = f"{problem}; its target matches the source reviewed on torchrec {found.matched}"
                    continue
                why = {
                    "drifted": f"its target {status.patch.target} (digest {found.digest}) differs from every "
                    "reviewed version",
                    "unreviewed": f"its target {status.patch.target} has no reviewed digest",
                    "missing": f"its target {status.patch.target} is gone ({found.detail})",
                }[found.state]
                problem = f"{problem}, and {why}"
            status.state, status.detail = PatchState.SKIPPED, problem
            skipped[name] = problem
        if skipped or admitted:
            self._warn(versions, names, skipped, admitted)

    def _warn(
        self,
        versions: Mapping[str, Optional[str]],
        names: Mapping[str, str],
        skipped: Mapping[str, str],
        admitted: Mapping[str, str],
    ) -> None:
        found = ", ".join(f"{names[d]} {v or 'not installed'}" for d, v in sorted(versions.items()))
        lines = [f"torchrec-ascend: versions outside what its patches were written for ({found})."]
        if admitted:
            lines.append(f"Applied on a reviewed target source ({len(admitted)}): {', '.join(admitted)}.")
        if skipped:
            lines.append(f"Skipped ({len(skipped)}); TorchRec's own code runs there:")
            lines += [f"  - {n}: {p}" for n, p in skipped.items()]
        lines.append(
            "Install a supported stack (torchrec_ascend/versions.py; `torchrec-ascend doctor` shows it) or a "
            "torchrec-ascend release that supports your versions."
        )
        warnings.warn("\n".join(lines), RuntimeWarning, stacklevel=4)

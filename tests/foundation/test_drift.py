"""Drift detection: every patch target's installed source against the digest reviewed for this TorchRec release.

Oracles: the reviewed data file (torchrec_ascend/hooks/reviewed.py, recorded when each stack was reviewed), the
version table, and throw-away modules whose source the tests change.
"""

from __future__ import annotations

import importlib.metadata
import warnings
from pathlib import Path
from types import ModuleType
from typing import Callable

import pytest

from torchrec_ascend import hooks, versions
from torchrec_ascend.cli import doctor
from torchrec_ascend.injection import autoload, drift
from torchrec_ascend.injection.patch import Patch
from torchrec_ascend.injection.registry import PatchRegistry, PatchState

TORCHREC = importlib.metadata.version("torchrec")


def test_every_patch_target_is_the_source_reviewed_for_this_torchrec() -> None:
    """Fails naming each patch and target whose installed source differs from the reviewed one (or has none)."""
    row = versions.stack_for(TORCHREC)
    assert row is not None, f"torchrec {TORCHREC} has no row in torchrec_ascend/versions.py"
    reviewed = drift.reviewed_digests()
    problems = []
    for patch in hooks.default_patches():
        found = drift.check(patch, reviewed.get(patch.name), row.reviewed)
        if found.state != "reviewed" or found.matched != row.reviewed:
            recorded = reviewed.get(patch.name, {}).get(row.reviewed, "nothing recorded")
            problems.append(f"{patch.name} ({patch.target}): {found.state} {found.digest or found.detail}, "
                            f"reviewed on torchrec {row.reviewed}: {recorded}")
    assert not problems, (
        f"patch targets differ from their reviewed source on torchrec {TORCHREC}; review each target's change, then "
        "record with `python -m torchrec_ascend.injection.drift --record`:\n" + "\n".join(problems)
    )


def test_the_reviewed_data_covers_every_patch_and_every_row() -> None:
    reviewed = drift.reviewed_digests()
    names = {p.name for p in hooks.default_patches()}
    missing = {
        name: [s.reviewed for s in versions.STACKS if s.reviewed not in reviewed.get(name, {})] for name in names
    }
    assert {name: rows for name, rows in missing.items() if rows} == {}
    targets = {p.name: p.target for p in hooks.default_patches()}
    from torchrec_ascend.hooks.reviewed import REVIEWED

    assert {n: e["target"] for n, e in REVIEWED.items() if n in targets} == targets


def _rewrite(module: ModuleType, old: str, new: str) -> None:
    path = Path(module.__file__)
    path.write_text(path.read_text().replace(old, new))
    drift.target_digest.cache_clear()


def test_a_changed_target_is_reported_by_name(
    new_target_module: Callable[[], ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source of a patched target changes: check(), the registry (newer TorchRec) and doctor name the patch."""
    module = new_target_module()
    patch = Patch.wrap("t.watched", f"{module.__name__}:Base.method", {"torchrec": ">=1.8.0,<1.9"}, "test",
                       lambda f: lambda self: f(self) + "+")
    reviewed = {"t.watched": {"1.8.0": drift.target_digest(patch.target)}}
    assert drift.check(patch, reviewed["t.watched"]).state == "reviewed"

    _rewrite(module, 'return "method"', 'return "changed"')
    found = drift.check(patch, reviewed["t.watched"])
    assert found.state == "drifted" and found.digest != reviewed["t.watched"]["1.8.0"]

    registry = PatchRegistry([patch], versions={"torchrec": "1.9.0"}, reviewed=reviewed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry.apply()
    assert registry.status("t.watched").state is PatchState.SKIPPED
    assert f"its target {patch.target} (digest {found.digest}) differs" in registry.status("t.watched").detail
    assert len(caught) == 1 and "t.watched" in str(caught[0].message)
    assert module.Base().method() == "method", "a skipped patch changes nothing"

    monkeypatch.setattr(autoload, "registry", lambda: registry)
    text = doctor.diagnose().text
    assert "  skipped  t.watched  [requires torchrec]" in text
    assert f"source {found.digest} DRIFTED" in text
    assert "Targets not the reviewed source (1): t.watched" in text
    drift.target_digest.cache_clear()


def test_sources_are_found_through_imports_and_base_classes(new_target_module: Callable[[], ModuleType]) -> None:
    """Child.method is Base's definition; a name a module imported is the definition in its own module."""
    module = new_target_module()
    assert drift.target_source(f"{module.__name__}:Child.method") == drift.target_source(
        f"{module.__name__}:Base.method"
    )
    assert drift.target_source(f"{module.__name__}:Base.static").lstrip().startswith("@staticmethod")
    importer = new_target_module()
    Path(importer.__file__).write_text(f"from {module.__name__} import f0 as g\n")
    assert drift.target_source(f"{importer.__name__}:g") == drift.target_source(f"{module.__name__}:f0")
    with pytest.raises(LookupError, match="nope is not defined"):
        drift.target_source(f"{module.__name__}:nope")

"""PatchRegistry on test-only targets: order, once-only, subsets, versions, failures (oracle: the targets' values)."""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Any, Callable, Dict, List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from patch_targets import FUNCTIONS
from torchrec_ascend.adapters.requirements import installed_distribution, newer_than, version_problem
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.injection import drift
from torchrec_ascend.injection.patch import Patch, Undo, resolve, set_attribute
from torchrec_ascend.injection.registry import PatchRegistry, PatchState

REQUIRES = {"torchrec": ">=1.8.0,<1.9"}
SUPPORTED = {"torchrec": "1.8.0"}


def tagging(tag: str, log: List[str] | None = None) -> Callable[[Any], Any]:
    """A wrapper appending ``tag`` to the result (and logging the order it was applied in)."""

    def wrapper(original: Callable[[], str]) -> Callable[[], str]:
        if log is not None:
            log.append(tag)
        return lambda: original() + tag

    return wrapper


def patch_for(module: ModuleType, attr: str, tag: str = "+", log: List[str] | None = None, **kw: Any) -> Patch:
    return Patch.wrap(f"t.{attr}{tag}", f"{module.__name__}:{attr}", kw.get("requires", REQUIRES), "test",
                      tagging(tag, log))


def failing_patch(module: ModuleType) -> Patch:
    def apply_fn(patch: Patch) -> Undo:
        resolve(patch.target)
        raise RuntimeError("simulated apply failure")

    return Patch("t.failing", f"{module.__name__}:f5", REQUIRES, "test", apply_fn)


def values(module: ModuleType) -> Dict[str, str]:
    return {name: getattr(module, name)() for name in FUNCTIONS}


def test_duplicate_names_are_refused(new_target_module: Callable[[], ModuleType]) -> None:
    module = new_target_module()
    patch = patch_for(module, "f0")
    with pytest.raises(ValueError, match="already registered"):
        PatchRegistry([patch, patch_for(module, "f0")], versions=SUPPORTED)


def test_applies_in_declared_order_once(new_target_module: Callable[[], ModuleType]) -> None:
    module = new_target_module()
    log: List[str] = []
    patches = [patch_for(module, "f0", tag, log) for tag in "abc"]  # three wraps of one target, stacked
    registry = PatchRegistry(patches, versions=SUPPORTED)
    registry.apply()
    registry.apply()
    assert log == ["a", "b", "c"]
    assert module.f0() == "f0abc"
    assert {s.state for s in registry.report()} == {PatchState.APPLIED}
    registry.revert()
    assert module.f0() == "f0"


def test_context_manager_applies_and_reverts(new_target_module: Callable[[], ModuleType]) -> None:
    module = new_target_module()
    with PatchRegistry([patch_for(module, "f1"), patch_for(module, "f2")], versions=SUPPORTED) as registry:
        assert (module.f1(), module.f2()) == ("f1+", "f2+")
    assert (module.f1(), module.f2()) == ("f1", "f2")
    assert {s.state for s in registry.report()} == {PatchState.REVERTED}


# The fixture is a factory: every example makes its own module, so sharing the fixture across examples is safe.
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(subset=st.sets(st.sampled_from(FUNCTIONS)))
def test_reverting_any_subset_restores_exactly_it(new_target_module: Callable[[], ModuleType], subset: set) -> None:
    module = new_target_module()
    registry = PatchRegistry([patch_for(module, name) for name in FUNCTIONS], versions=SUPPORTED)
    registry.apply()
    registry.revert([f"t.{name}+" for name in subset])
    assert values(module) == {name: name if name in subset else name + "+" for name in FUNCTIONS}
    for name in FUNCTIONS:
        expected = PatchState.REVERTED if name in subset else PatchState.APPLIED
        assert registry.status(f"t.{name}+").state is expected
    registry.revert()
    assert values(module) == {name: name for name in FUNCTIONS}


def test_reverting_from_under_a_later_patch_of_the_same_target_is_refused(
    new_target_module: Callable[[], ModuleType],
) -> None:
    module = new_target_module()
    registry = PatchRegistry([patch_for(module, "f0", "a"), patch_for(module, "f0", "b")], versions=SUPPORTED)
    registry.apply()
    with pytest.raises(ValueError, match="t.f0b"):
        registry.revert(["t.f0a"])
    assert module.f0() == "f0ab", "a refused revert changes nothing"
    registry.revert(["t.f0b"])
    assert module.f0() == "f0a"
    registry.revert()
    assert module.f0() == "f0"


def test_unknown_names_in_revert_are_refused(new_target_module: Callable[[], ModuleType]) -> None:
    registry = PatchRegistry([patch_for(new_target_module(), "f0")], versions=SUPPORTED)
    with pytest.raises(ConfigError, match="no patch named t.nope"):
        registry.revert(["t.nope"])


def test_pending_patches_wait_for_their_module(new_target_module: Callable[[], ModuleType]) -> None:
    module = new_target_module()
    late = Patch.wrap("t.late", "module_never_imported_xyz:f", REQUIRES, "test", tagging("+"))
    registry = PatchRegistry([patch_for(module, "f0"), late], versions=SUPPORTED)
    assert registry.watched_modules() == {module.__name__, "module_never_imported_xyz"}
    registry.apply(loaded_module=module.__name__)
    assert registry.status("t.f0+").state is PatchState.APPLIED
    assert registry.status("t.late").state is PatchState.PENDING
    assert registry.watched_modules() == {"module_never_imported_xyz"}
    registry.revert()


@pytest.mark.parametrize(
    "versions, problem",
    [
        ({"torchrec": "1.7.0"}, "torchrec 1.7.0 is outside the supported range"),
        ({"torchrec": None}, "torchrec is not installed"),
    ],
)
def test_unsupported_versions_skip_the_patches_that_need_them_with_one_warning(
    new_target_module: Callable[[], ModuleType], versions: Dict[str, Any], problem: str
) -> None:
    """Older than its range (or not installed): the patch is skipped, a patch without requirements still applies."""
    module = new_target_module()
    unconstrained = patch_for(module, "f1", requires={})
    registry = PatchRegistry([patch_for(module, "f0"), unconstrained], versions=versions)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry.apply()
        registry.apply()
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert problem in message and "t.f0+" in message and "t.f1+" not in message
    assert values(module)["f0"] == "f0" and values(module)["f1"] == "f1+"
    assert registry.status("t.f0+").state is PatchState.SKIPPED and problem in registry.status("t.f0+").detail
    assert registry.status("t.f1+").state is PatchState.APPLIED
    registry.revert()


def test_newer_versions_apply_exactly_the_patches_whose_target_was_reviewed(
    new_target_module: Callable[[], ModuleType],
) -> None:
    """Newer than the range: reviewed source -> applied (admitted), changed or unreviewed source -> skipped, named."""
    module = new_target_module()
    patches = [patch_for(module, name) for name in ("f0", "f1", "f2")]
    reviewed = {
        "t.f0+": {"1.8.0": drift.target_digest(patches[0].target)},  # the installed source: reviewed
        "t.f1+": {"1.8.0": "0123456789abcdef"},  # some other source was reviewed
    }  # t.f2+: nothing reviewed
    registry = PatchRegistry(patches, versions={"torchrec": "1.9.0"}, reviewed=reviewed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry.apply()
        registry.apply()
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert values(module) == {**{name: name for name in FUNCTIONS}, "f0": "f0+"}
    assert registry.status("t.f0+").state is PatchState.APPLIED and registry.status("t.f0+").admitted == "1.8.0"
    for name, why in (("t.f1+", "differs from every reviewed version"), ("t.f2+", "has no reviewed digest")):
        status = registry.status(name)
        assert status.state is PatchState.SKIPPED, name
        assert f"its target {status.patch.target}" in status.detail and why in status.detail, status.detail
        assert f"{name}: torchrec 1.9.0 is outside the supported range" in message
    assert "Applied on a reviewed target source (1): t.f0+" in message
    registry.revert()


def test_newer_than_is_above_the_upper_bound_only() -> None:
    assert newer_than("1.10.0", ">=1.8.0,<1.10") and newer_than("2.0", ">=1.8.0,<1.10")
    assert not newer_than("1.7.9", ">=1.8.0,<1.10") and not newer_than("1.9.2", ">=1.8.0,<1.10")
    assert newer_than("1.9.0", "<=1.8.5") and not newer_than("1.9.0", ">=2.0")


def test_a_failing_patch_reverts_the_applied_ones(new_target_module: Callable[[], ModuleType]) -> None:
    module = new_target_module()
    patches = [patch_for(module, "f0"), patch_for(module, "f1"), failing_patch(module), patch_for(module, "f2")]
    registry = PatchRegistry(patches, versions=SUPPORTED)
    with pytest.warns(RuntimeWarning, match="simulated apply failure"):
        registry.apply()
    assert values(module) == {name: name for name in FUNCTIONS}
    states = {s.patch.name: s.state for s in registry.report()}
    assert states == {
        "t.f0+": PatchState.SKIPPED,
        "t.f1+": PatchState.SKIPPED,
        "t.failing": PatchState.FAILED,
        "t.f2+": PatchState.SKIPPED,
    }
    assert "simulated apply failure" in registry.status("t.failing").detail
    assert "t.failing" in registry.status("t.f2+").detail


def test_version_problem_alternatives_and_prereleases() -> None:
    requires = {"fbgemm-gpu|fbgemm-gpu-cpu": ">=1.8.0,<1.9"}
    assert version_problem(requires, {"fbgemm-gpu|fbgemm-gpu-cpu": "1.8.0"}) is None
    assert version_problem(requires, {"fbgemm-gpu|fbgemm-gpu-cpu": "1.8.1rc2"}) is None
    assert "1.9.0" in version_problem(requires, {"fbgemm-gpu|fbgemm-gpu-cpu": "1.9.0"})
    assert version_problem(requires, {}) == "fbgemm-gpu nor fbgemm-gpu-cpu is not installed (needs >=1.8.0,<1.9)"
    assert version_problem({"torch": ">=2.10"}, {"torch": "2.13.0+cpu"}) is None, "PEP 440, not strings"


def test_installed_distribution_takes_the_first_installed_alternative() -> None:
    assert installed_distribution("surely-not-installed-dist|pluggy")[0] == "pluggy"
    assert installed_distribution("surely-not-installed-dist") is None


def test_requirements_lists_every_key(new_target_module: Callable[[], ModuleType]) -> None:
    module = new_target_module()
    fbgemm = {**REQUIRES, "fbgemm-gpu|fbgemm-gpu-cpu": ">=1.8.0,<1.9"}
    registry = PatchRegistry([patch_for(module, "f0"), patch_for(module, "f1", requires=fbgemm)])
    assert registry.requirements() == fbgemm


def test_set_attribute_undo_is_what_patches_return(new_target_module: Callable[[], ModuleType]) -> None:
    """A hand-written apply step (as H3's) composes with the registry like a wrap."""
    module = new_target_module()

    def apply_fn(patch: Patch) -> Undo:
        owner, attr = resolve(patch.target)
        return set_attribute(owner, attr, lambda: "replaced")

    with PatchRegistry([Patch("t.set", f"{module.__name__}:f3", REQUIRES, "test", apply_fn)], versions=SUPPORTED):
        assert module.f3() == "replaced"
    assert module.f3() == "f3"

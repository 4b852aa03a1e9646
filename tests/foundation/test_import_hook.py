"""The lazy import hook on a test-only package: watched modules are reported after they run, others untouched.

Oracle: what the modules themselves record while executing (a module reported before its body ran would show it),
and the plain finders' answers for the modules the hook must not touch.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from torchrec_ascend.injection import import_hook

_counter = itertools.count()


@pytest.fixture
def package(tmp_path: Path) -> Iterator[Tuple[str, List[str]]]:
    """A package ``hookpkg_<n>`` with modules ``watched`` and ``other``; yields (name, event log)."""
    name = f"hookpkg_{next(_counter)}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    for module in ("watched", "other"):
        (root / f"{module}.py").write_text(
            f'"""Test module."""\nimport builtins\nbuiltins.HOOK_EVENTS.append("ran {module}")\n\n'
            f"def answer():\n    return 42\n"
        )
    import builtins

    builtins.HOOK_EVENTS = []  # type: ignore[attr-defined]  # a test-only global the hook module appends to
    sys.path.insert(0, str(tmp_path))
    yield name, builtins.HOOK_EVENTS  # type: ignore[attr-defined]  # the test-only global
    sys.path.remove(str(tmp_path))
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]
    del builtins.HOOK_EVENTS  # type: ignore[attr-defined]  # the test-only global


def make_hook(name: str, events: List[str]) -> import_hook.TorchRecImportHook:
    return import_hook.TorchRecImportHook(
        on_first_import=lambda: events.append("first import"),
        watched=lambda: {f"{name}.watched"},
        on_loaded=lambda module: events.append(f"loaded {module}"),
        on_failed=lambda module, err: events.append(f"failed {module}: {err}"),
        prefix=name,
    )


def test_watched_module_is_reported_after_it_ran(package: Tuple[str, List[str]]) -> None:
    name, events = package
    hook = make_hook(name, events)
    import_hook.install(hook)
    try:
        module = importlib.import_module(f"{name}.watched")
    finally:
        import_hook.uninstall(hook)
    assert events == ["first import", "ran watched", f"loaded {name}.watched"]
    assert module.answer() == 42


def test_other_modules_are_delegated_untouched(package: Tuple[str, List[str]]) -> None:
    name, events = package
    hook = make_hook(name, events)
    import_hook.install(hook)
    try:
        other = importlib.import_module(f"{name}.other")
        unrelated = hook.find_spec("json", None)
    finally:
        import_hook.uninstall(hook)
    assert events == ["first import", "ran other"], "no report for a module that is not watched"
    assert type(other.__loader__).__name__ == "SourceFileLoader", "the plain loader, not wrapped"
    assert unrelated is None, "names outside the package are not even looked at"


def test_wrapped_loader_still_serves_source_and_filename(package: Tuple[str, List[str]]) -> None:
    name, events = package
    hook = make_hook(name, events)
    import_hook.install(hook)
    try:
        module = importlib.import_module(f"{name}.watched")
    finally:
        import_hook.uninstall(hook)
    assert type(module.__loader__).__name__ != "SourceFileLoader", "the watched module's loader is wrapped"
    assert "def answer" in module.__loader__.get_source(module.__name__)
    assert module.__loader__.get_filename(module.__name__).endswith("watched.py")
    assert "return 42" in inspect.getsource(module.answer)


def test_install_is_idempotent_and_first(package: Tuple[str, List[str]]) -> None:
    name, events = package
    hook = make_hook(name, events)
    import_hook.install(hook)
    import_hook.install(hook)
    try:
        assert sys.meta_path[0] is hook
        assert sys.meta_path.count(hook) == 1
    finally:
        import_hook.uninstall(hook)
    assert hook not in sys.meta_path


def test_first_import_callback_runs_once(package: Tuple[str, List[str]]) -> None:
    name, events = package
    hook = make_hook(name, events)
    import_hook.install(hook)
    try:
        importlib.import_module(f"{name}.other")
        importlib.import_module(f"{name}.watched")
    finally:
        import_hook.uninstall(hook)
    assert events.count("first import") == 1


def test_a_failing_package_import_is_reported_and_the_error_propagates(package: Tuple[str, List[str]]) -> None:
    """The package's body (which imports the rest) raising: ``on_failed`` sees the error, the importer gets it."""
    name, events = package
    hook = make_hook(name, events)
    (Path(sys.path[0]) / name / "__init__.py").write_text("raise OSError('libfoo.so: cannot open shared object file')")
    import_hook.install(hook)
    try:
        with pytest.raises(OSError, match="libfoo.so"):
            importlib.import_module(name)
    finally:
        import_hook.uninstall(hook)
    assert events == ["first import", f"failed {name}: libfoo.so: cannot open shared object file"]

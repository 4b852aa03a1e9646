"""A lazy import hook: runs a callback right after a watched ``torchrec.*`` module finishes executing.

It is a ``sys.meta_path`` finder (pytest's assertion rewriter is the model): a cheap name filter first, finding is
delegated to the other finders, and only ``exec_module`` of the watched modules is wrapped. Nothing is imported
eagerly; importing torch alone never imports torchrec.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Optional, Sequence

PREFIX = "torchrec"


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then calls ``on_loaded(name)`` once the module body has run, or
    ``on_failed(name, error)`` if it raised (the error then propagates unchanged)."""

    def __init__(
        self,
        loader: importlib.abc.Loader,
        on_loaded: Callable[[str], None],
        on_failed: Callable[[str, BaseException], None],
    ) -> None:
        self._loader = loader
        self._on_loaded = on_loaded
        self._on_failed = on_failed

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        except BaseException as err:
            self._on_failed(module.__name__, err)
            raise
        self._on_loaded(module.__name__)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for inspect and linecache
        return getattr(self._loader, name)


class TorchRecImportHook(importlib.abc.MetaPathFinder):
    """Calls ``on_first_import()`` before the first ``torchrec`` module loads, then ``on_loaded(name)`` after each
    module in ``watched()`` executes, and ``on_failed(name, error)`` if the package itself (``torchrec``, whose
    body imports the rest) fails to import.

    Args:
        on_first_import: called once, before the first module of the package is found (may raise: the import
            that triggered it fails with that error).
        watched: returns the module names to report (asked on every import of the package).
        on_loaded: called with the module name once a watched module's body has run.
        on_failed: called with the module name and the error when a watched module's body, or the package's, raises
            (it may add a note to the error; the error propagates).
        prefix: the top-level package watched (``torchrec``; tests use a package of their own).

    Example::

        hook = TorchRecImportHook(lambda: None, lambda: {"torchrec.distributed.utils"}, print)
        install(hook)   # `import torchrec.distributed.utils` now prints its name once it has executed
    """

    def __init__(
        self,
        on_first_import: Callable[[], None],
        watched: Callable[[], set],
        on_loaded: Callable[[str], None],
        on_failed: Callable[[str, BaseException], None] = lambda name, err: None,
        prefix: str = PREFIX,
    ) -> None:
        self._on_first_import = on_first_import
        self._watched = watched
        self._on_loaded = on_loaded
        self._on_failed = on_failed
        self._prefix = prefix
        self._started = False
        self._busy = threading.local()

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        """Delegate finding to the other finders; wrap the loader of a watched module (None: not ours)."""
        prefix = self._prefix
        if not (fullname == prefix or fullname.startswith(prefix + ".")) or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            if not self._started:
                self._started = True
                self._on_first_import()
            watched = fullname in self._watched()
            if not watched and fullname != prefix:  # the package itself is wrapped for on_failed only
                return None
            spec = _find_with_others(self, fullname, path, target)
        finally:
            self._busy.on = False
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, self._on_loaded if watched else _ignore, self._on_failed)
        return spec


def _ignore(name: str) -> None:
    pass


def _find_with_others(
    me: importlib.abc.MetaPathFinder, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType]
) -> Optional[importlib.machinery.ModuleSpec]:
    for finder in sys.meta_path:
        if finder is me or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def install(hook: TorchRecImportHook) -> None:
    """Put ``hook`` first on ``sys.meta_path`` (once)."""
    if hook not in sys.meta_path:
        sys.meta_path.insert(0, hook)


def uninstall(hook: TorchRecImportHook) -> None:
    """Remove ``hook`` from ``sys.meta_path`` (modules already patched stay patched)."""
    if hook in sys.meta_path:
        sys.meta_path.remove(hook)

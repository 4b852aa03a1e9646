"""Loads torchrec-ascend plugins from the ``torchrec_ascend`` entry-point group, built-ins included.

pluggy does the registration; this module adds what pluggy leaves to its host: entry-point load failures, hook
exceptions and misspelled hooks are wrapped in a :class:`PluginError` naming the plugin and its distribution,
plugins can be blocked by name (``TORCHREC_ASCEND_BLOCK_PLUGINS=a,b``), and every plugin can be traced to the
distribution that supplied it.

Example::

    from torchrec_ascend.plugin_manager import get_plugin_manager
    for info in get_plugin_manager().plugins():
        print(info.name, info.distribution, info.version)
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
from typing import Any, Callable, Dict, List, Optional, TypeVar

import pluggy

from torchrec_ascend import hookspecs
from torchrec_ascend.errors import PluginError

ENTRY_POINT_GROUP = hookspecs.PROJECT
BLOCK_ENV = "TORCHREC_ASCEND_BLOCK_PLUGINS"

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    """Where a registered plugin came from.

    Attributes:
        name: the plugin's name (its entry-point name, or the name given to :meth:`PluginManager.register`).
        distribution: the distribution that declared the entry point (``"(registered in-process)"`` otherwise).
        version: that distribution's version.
        module: the entry point's ``module[:attr]`` value, or the plugin's module name.
    """

    name: str
    distribution: str
    version: str
    module: str


class PluginManager:
    """The torchrec-ascend plugin manager: pluggy plus provenance, blocking and error wrapping.

    Args:
        blocked: plugin names never to register (their entry points are not even imported).

    Example::

        manager = PluginManager(blocked=["s3fifo"])
        manager.load_entry_points()
        [info.name for info in manager.plugins()]   # ['builtin_backends', 'builtin_policies']
    """

    def __init__(self, blocked: Optional[List[str]] = None) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._info: Dict[str, PluginInfo] = {}
        self._revision = 0
        for name in blocked or []:
            self._pm.set_blocked(name)

    @property
    def revision(self) -> int:
        """Grows by one on every registration change: callers caching what the plugins provide compare it."""
        return self._revision

    def load_entry_points(self) -> None:
        """Register every plugin of the entry-point group (built-ins and third parties alike).

        Raises:
            PluginError: an entry point fails to import, or a plugin implements a hook that does not exist (a
                misspelling); the message names the plugin, its distribution and how to block it.
        """
        for dist in importlib.metadata.distributions():
            for ep in dist.entry_points:
                if ep.group != ENTRY_POINT_GROUP or self._pm.has_plugin(ep.name) or self._pm.is_blocked(ep.name):
                    continue
                dist_name = dist.metadata["Name"]
                try:
                    plugin = ep.load()
                except Exception as err:
                    raise PluginError(
                        f"torchrec-ascend plugin {ep.name!r} from distribution {dist_name} {dist.version} "
                        f"failed to import ({ep.value}): {type(err).__name__}: {err}. Fix or uninstall that "
                        f"distribution, or block the plugin with {BLOCK_ENV}={ep.name}."
                    ) from err
                self.register(plugin, ep.name, PluginInfo(ep.name, dist_name, dist.version, ep.value))
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as err:
            name = self._pm.get_name(err.plugin) or repr(err.plugin)
            info = self._info.get(name)
            origin = f"{info.distribution} {info.version}" if info else "unknown distribution"
            raise PluginError(
                f"torchrec-ascend plugin {name!r} ({origin}) implements a hook that does not exist: {err}. Hook "
                f"names must match torchrec_ascend.hookspecs; fix the name, or block the plugin with "
                f"{BLOCK_ENV}={name}."
            ) from err

    def register(self, plugin: Any, name: str, info: Optional[PluginInfo] = None) -> None:
        """Register ``plugin`` under ``name`` (tests and programs may add plugins without an entry point).

        Raises:
            ValueError: (from pluggy) ``name`` or ``plugin`` is already registered.
        """
        self._pm.register(plugin, name=name)
        module = getattr(plugin, "__name__", type(plugin).__name__)
        self._info[name] = info or PluginInfo(name, "(registered in-process)", "", module)
        self._revision += 1

    def unregister(self, name: str) -> None:
        """Remove the plugin registered as ``name``."""
        self._pm.unregister(name=name)
        self._info.pop(name, None)
        self._revision += 1

    def plugins(self) -> List[PluginInfo]:
        """Every registered plugin with the distribution it came from, in registration order."""
        return [self._info[name] for name, _ in self._pm.list_name_plugin() if name in self._info]

    def info(self, name: str) -> PluginInfo:
        """Provenance of the plugin registered as ``name`` (KeyError if there is none)."""
        return self._info[name]

    def collect(self, hook_name: str) -> List[tuple]:
        """Call a list-returning hook on every plugin; return ``(item, PluginInfo)`` pairs in registration order.

        Raises:
            PluginError: a plugin raised; the message names it, the hook and the distribution (pluggy would
                re-raise the exception bare).
        """
        caller = getattr(self._pm.hook, hook_name)
        out: List[tuple] = []
        for impl in caller.get_hookimpls():  # registration order (pluggy calls them in reverse)
            name = self._pm.get_name(impl.plugin) or repr(impl.plugin)
            info = self._info.get(name, PluginInfo(name, "?", "?", "?"))
            try:
                items = impl.function() or []
            except Exception as err:
                raise PluginError(
                    f"plugin {name!r} ({' '.join(filter(None, (info.distribution, info.version)))}) raised in hook "
                    f"{hook_name}: {type(err).__name__}: {err}"
                ) from err
            out.extend((item, info) for item in items)
        return out


@functools.lru_cache(maxsize=None)
def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, loaded from entry points on first use (honours ``BLOCK_ENV``)."""
    blocked = [n.strip() for n in os.environ.get(BLOCK_ENV, "").split(",") if n.strip()]
    pm = PluginManager(blocked)
    pm.load_entry_points()
    return pm


def reset_plugin_manager() -> None:
    """Forget the cached manager (tests that install or block plugins call this); caches keyed on it expire."""
    get_plugin_manager.cache_clear()


def wrap_plugin_call(plugin: str, hook: str, info: Optional[PluginInfo], fn: Callable[..., T]) -> Callable[..., T]:
    """Return ``fn`` wrapped so any exception names ``plugin``, ``hook`` and the plugin's distribution.

    Example::

        safe = wrap_plugin_call("lfu", "torchrec_ascend_policies", info, factory)
        safe()   # a failure raises PluginError("'lfu' (dist 1.0) raised in torchrec_ascend_policies: ...")
    """

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except PluginError:
            raise
        except Exception as err:
            origin = f"{info.distribution} {info.version}" if info else "unknown distribution"
            raise PluginError(
                f"{plugin!r} ({origin}) raised in {hook}: {type(err).__name__}: {err}"
            ) from err

    return call

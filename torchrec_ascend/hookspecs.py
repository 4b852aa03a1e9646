"""The hook specification of torchrec-ascend plugins (one module, pluggy's model).

A plugin is a module (or object) with functions marked ``@hookimpl`` and is registered through the entry-point
group ``torchrec_ascend``, exactly like the built-ins::

    # pyproject.toml of a third-party distribution
    [project.entry-points.torchrec_ascend]
    my_policies = "my_package.policies"

Hooks are called at discovery time only (listing what a plugin offers); nothing here runs per batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import pluggy

if TYPE_CHECKING:
    from torchrec_ascend.backends.profile import DeviceProfile
    from torchrec_ascend.policies.base import PolicySpec

PROJECT = "torchrec_ascend"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Marker to be imported and used in plugins.
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def torchrec_ascend_device_backends() -> Optional[List["DeviceProfile"]]:
    """Return the device backend profiles this plugin provides.

    Every implementation is called and the lists are concatenated; two profiles with the same ``name`` are an
    error naming both plugins. Return an empty list (or ``None``) to provide none.
    """


@hookspec
def torchrec_ascend_policies() -> Optional[List["PolicySpec"]]:
    """Return the cache eviction and admission policies this plugin provides.

    Every implementation is called and the lists are concatenated. Each :class:`PolicySpec` carries the name a
    table config uses to choose it (``HashEmbeddingBagConfig(eviction_policy="lfu")``), its kind (``"eviction"``
    or ``"admission"``) and a factory. Names must be unique across all plugins. Return an empty list (or ``None``)
    to provide none.
    """

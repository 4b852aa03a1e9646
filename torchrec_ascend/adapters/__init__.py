"""Adapters: the only code outside the patches that touches TorchRec's private names, one module per subsystem.

TorchRec keeps some of what torchrec-ascend must read or drive in private fields (the sparse-dist pipeline's
state, an input dist's process group, a sharding's device). Each adapter module wraps one subsystem's privates in
named functions or accessors, and declares them in an :class:`Adapter` record: its name, the TorchRec object it
adapts, every private name it touches, and the versions it was written for (the version table's ranges, gated by
the same code as the patches: :mod:`.requirements`). ``torchrec-ascend doctor`` lists each adapter with its state.

========================  =====================================================================================
module                    adapts
========================  =====================================================================================
:mod:`.train_pipeline`    ``TrainPipelineSparseDist`` internals, the pipelined input dists (``KJTAllToAllForward``)
:mod:`.sharding`          row-wise input dists (``RwSparseFeaturesDist``) and embedding shardings' fields
:mod:`.tbe`               the batched embedding kernels' fbgemm TBE and table layout (``BaseBatchedEmbeddingBag``)
:mod:`.lookups`           sharded embedding modules' lookups and their kernels (``GroupedPooledEmbeddingsLookup``)
========================  =====================================================================================

Example::

    from torchrec_ascend import adapters
    [(s.adapter.name, s.state) for s in adapters.report()]   # [('a.train_pipeline', 'supported'), ...]
    adapters.require(train_pipeline.ADAPTER, "HybridTrainPipelineSparseDist")   # ConfigError outside its range
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from typing import List, Mapping, Optional, Tuple

from torchrec_ascend.adapters.requirements import installed_problem
from torchrec_ascend.dotted import resolve_object, split_path
from torchrec_ascend.errors import ConfigError

#: The adapter modules, one per TorchRec subsystem (each defines ``ADAPTER``).
MODULES: Tuple[str, ...] = ("train_pipeline", "sharding", "tbe", "lookups")


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One TorchRec subsystem's private names, as one adapter module touches them.

    Args:
        name: unique dotted name, ``"a.<subsystem>"``.
        target: ``"module:qualname"`` of the TorchRec object adapted (shown by ``doctor``).
        privates: every private name the adapter touches, ``"module:Class._field"`` or ``"module:_function"``;
            a class's field may be a class attribute or one its ``__init__`` (or a base's) assigns.
        requires: distribution -> PEP 440 specifier (one of :mod:`torchrec_ascend.versions`' ranges).
        reason: one line saying why the private names are needed.
    """

    name: str
    target: str
    privates: Tuple[str, ...]
    requires: Mapping[str, str]
    reason: str


@dataclasses.dataclass(frozen=True)
class AdapterStatus:
    """An adapter's state: ``supported``, ``unsupported`` (versions outside its range) or ``missing`` (a private
    name it touches is gone); ``detail`` says why ('' when supported)."""

    adapter: Adapter
    state: str
    detail: str = ""


def adapters() -> List[Adapter]:
    """Every adapter, in :data:`MODULES` order (imports the adapter modules, and so TorchRec)."""
    return [importlib.import_module(f"{__name__}.{module}").ADAPTER for module in MODULES]


@functools.lru_cache(maxsize=None)
def missing_private(private: str) -> str:
    """Why ``private`` cannot be found ('' if it can): a module or class attribute, or a field that a class on the
    owner's MRO assigns as ``self.<field>`` (TorchRec sets most of them in ``__init__``)."""
    module, qualname = split_path(private)
    owner_path, _, attr = qualname.rpartition(".")
    try:
        owner = resolve_object(f"{module}:{owner_path}") if owner_path else importlib.import_module(module)
    except (ImportError, AttributeError) as err:
        return f"{private}: {type(err).__name__}: {err}"
    if hasattr(owner, attr):
        return ""
    if inspect.isclass(owner):
        for klass in owner.__mro__[:-1]:
            try:
                if f"self.{attr}" in inspect.getsource(klass):
                    return ""
            except (OSError, TypeError):
                continue
    return f"{private} is not defined"


def check(adapter: Adapter) -> AdapterStatus:
    """The adapter's state on the installed versions.

    Example::

        check(train_pipeline.ADAPTER).state   # 'supported' on a stack of the version table
    """
    problem = installed_problem(adapter.requires)
    if problem is not None:
        return AdapterStatus(adapter, "unsupported", problem)
    missing = [why for why in map(missing_private, adapter.privates) if why]
    if missing:
        return AdapterStatus(adapter, "missing", "; ".join(missing))
    return AdapterStatus(adapter, "supported")


def report() -> List[AdapterStatus]:
    """Every adapter's state (what ``doctor`` prints)."""
    return [check(adapter) for adapter in adapters()]


def require(adapter: Adapter, user: str, instead: Optional[str] = None) -> None:
    """Refuse to go on where ``adapter`` is not supported.

    Args:
        adapter: the adapter ``user`` depends on.
        user: what depends on it, for the message (``"HybridTrainPipelineSparseDist"``).
        instead: what to use meanwhile, for the message.

    Raises:
        ConfigError: the installed versions are outside the adapter's range, or a private name it touches is gone.
    """
    status = check(adapter)
    if status.state == "supported":
        return
    ranges = ", ".join(f"{dist} {spec}" for dist, spec in adapter.requires.items())
    raise ConfigError(
        f"{user} drives TorchRec internals ({adapter.target}, adapter {adapter.name}) and was written for "
        f"{ranges}: {status.detail}. Install a supported stack (torchrec_ascend/versions.py; `torchrec-ascend "
        f"doctor` shows it)" + (f", or use {instead}." if instead else ".")
    )

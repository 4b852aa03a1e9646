"""Dotted paths to objects: the one resolver for ``"pkg.module:Qual.name"`` and ``"pkg.module.name"``.

Patch targets, adapter privates, kernel classes, device modules and the package's lazy names are all written as
dotted paths; this module turns them into objects.

Example::

    resolve_object("torchrec_ascend.errors:ConfigError")        # the class (imports the module)
    resolve_object("torch.npu")                                 # last dot splits module and attribute
    resolve_object("torch_npu._C:ProcessGroupHCCL", imported_only=True)   # None unless torch_npu is imported
    resolve_owner("torchrec.distributed.utils:sharded_model_copy.__enter__")  # (sharded_model_copy, "__enter__")
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Tuple


def split_path(path: str) -> Tuple[str, str]:
    """``(module, qualname)``: split at ``:`` if there is one, else at the last dot.

    Example::

        split_path("a.b:C.d")   # ('a.b', 'C.d')
        split_path("torch.npu")   # ('torch', 'npu')
    """
    if ":" in path:
        module, _, qualname = path.partition(":")
    else:
        module, _, qualname = path.rpartition(".")
    return module, qualname


def resolve_owner(path: str) -> Tuple[Any, str]:
    """``(owner, attribute)`` for a path, importing the module: the object holding the last name, and that name.

    Raises:
        ImportError: the module cannot be imported.
        AttributeError: a name before the last one (``Class`` in ``module:Class.attr``) does not exist.
    """
    module, qualname = split_path(path)
    owner: Any = importlib.import_module(module)
    *parents, attr = qualname.split(".")
    for part in parents:
        owner = getattr(owner, part)
    return owner, attr


def resolve_object(path: str, imported_only: bool = False) -> Any:
    """The object a path names.

    Args:
        path: ``"module:qualname"`` or ``"module.attr"``.
        imported_only: import nothing: None if the module is not imported yet or a name on the path is missing.

    Raises:
        ImportError, AttributeError: (without ``imported_only``) the module or a name on the path is missing.
    """
    if not imported_only:
        owner, attr = resolve_owner(path)
        return getattr(owner, attr)
    module, qualname = split_path(path)
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj

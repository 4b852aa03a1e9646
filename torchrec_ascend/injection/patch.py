"""Patch: one named, reversible change to a TorchRec object (pytest's MonkeyPatch is the model).

A patch is a frozen record: a dotted name, the ``module:qualname`` it changes, the distribution versions it was
written for, the one-line reason it exists, and an apply step that returns its own undo.

Example::

    patch = Patch.wrap(
        name="h1.sharding_types",
        target="torchrec.distributed.embedding_types:BaseEmbeddingSharder.sharding_types",
        requires={"torchrec": ">=1.8.0,<1.9"},
        reason="let the backend profile decide which sharding types a device supports",
        wrapper=lambda original: patched_function,
    )
    undo = patch.apply()
    undo()
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, Callable, Mapping, Tuple

Undo = Callable[[], None]
_NOTSET = object()


def resolve(target: str) -> Tuple[Any, str]:
    """Return ``(owner, attribute)`` for ``"pkg.module:Class.attr"`` (the module must be importable)."""
    module_name, _, qualname = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, attr


def set_attribute(owner: Any, attr: str, value: Any) -> Undo:
    """``setattr`` that records its undo; a class attribute is read from ``__dict__`` so descriptors survive."""
    if inspect.isclass(owner):
        old = owner.__dict__.get(attr, _NOTSET)
    else:
        old = getattr(owner, attr, _NOTSET)
    setattr(owner, attr, value)

    def undo() -> None:
        if old is _NOTSET:
            delattr(owner, attr)
        else:
            setattr(owner, attr, old)

    return undo


@dataclasses.dataclass(frozen=True)
class Patch:
    """A named change to one TorchRec object.

    Args:
        name: unique dotted name, prefixed with its hook point (``"h2.pooled_kernel_factory"``).
        target: ``"module:qualname"`` of the object changed; the patch applies once ``module`` is imported.
        requires: distribution name -> PEP 440 specifier of the versions this patch was written for.
        reason: one line saying why the patch exists.
        apply_fn: performs the change and returns a function that undoes it.
    """

    name: str
    target: str
    requires: Mapping[str, str]
    reason: str
    apply_fn: Callable[["Patch"], Undo] = dataclasses.field(repr=False, compare=False)

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    def apply(self) -> Undo:
        return self.apply_fn(self)

    @classmethod
    def wrap(
        cls,
        name: str,
        target: str,
        requires: Mapping[str, str],
        reason: str,
        wrapper: Callable[[Any], Any],
    ) -> "Patch":
        """A patch replacing ``target`` by ``wrapper(original)``.

        Patch the name where the consumer looks it up: ``from x import f`` copies the binding, so a module that
        imported ``f`` needs its own patch.
        """

        def apply_fn(patch: "Patch") -> Undo:
            owner, attr = resolve(patch.target)
            raw = owner.__dict__[attr] if inspect.isclass(owner) and attr in owner.__dict__ else getattr(owner, attr)
            descriptor = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
            replacement = wrapper(raw.__func__ if descriptor else raw)
            if descriptor:
                replacement = descriptor(replacement)
            return set_attribute(owner, attr, replacement)

        return cls(name=name, target=target, requires=dict(requires), reason=reason, apply_fn=apply_fn)

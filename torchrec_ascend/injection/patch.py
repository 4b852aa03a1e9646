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
import inspect
from typing import Any, Callable, Mapping, Tuple

from torchrec_ascend.dotted import resolve_owner

Undo = Callable[[], None]
_NOTSET = object()


def resolve(target: str) -> Tuple[Any, str]:
    """Return ``(owner, attribute)`` for ``"pkg.module:Class.attr"``, importing the module.

    Raises:
        ImportError: the module cannot be imported.
        AttributeError: a name on the path (``Class``) does not exist.

    Example::

        resolve("torchrec.distributed.utils:sharded_model_copy.__enter__")   # (sharded_model_copy, "__enter__")
    """
    return resolve_owner(target)


def raw_attribute(owner: Any, attr: str) -> Any:
    """``attr`` as stored: for a class, the raw ``staticmethod``/``classmethod``/function found along its MRO.

    Raises:
        AttributeError: ``owner`` has no such attribute.
    """
    if inspect.isclass(owner):
        for klass in owner.__mro__:
            if attr in klass.__dict__:
                return klass.__dict__[attr]
    return getattr(owner, attr)


def set_attribute(owner: Any, attr: str, value: Any) -> Undo:
    """``setattr`` that records its undo.

    A class attribute is read from the class's own ``__dict__``, so descriptors survive the round trip, and an
    attribute that the owner did not hold itself (absent, or inherited) is deleted again by the undo.

    Example::

        undo = set_attribute(SomeClass, "method", replacement)
        undo()   # SomeClass.__dict__ is as before
    """
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
        requires: distribution name -> PEP 440 specifier of the versions this patch was written for. A key may
            list alternative distributions of one package (``"fbgemm-gpu|fbgemm-gpu-cpu"``): the first installed
            one is checked.
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
        """The module whose import makes the patch applicable."""
        return self.target.partition(":")[0]

    def apply(self) -> Undo:
        """Make the change (importing the target module) and return its undo."""
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

        A ``staticmethod``/``classmethod`` target is unwrapped before ``wrapper`` sees it and rewrapped after, also
        when the class inherits it. Patch the name where the consumer looks it up: ``from x import f`` copies the
        binding, so a module that imported ``f`` needs its own patch.

        Example::

            Patch.wrap("h9.demo", "pkg.mod:Cls.method", {"pkg": ">=1,<2"}, "why", lambda original: original)
        """

        def apply_fn(patch: "Patch") -> Undo:
            owner, attr = resolve(patch.target)
            raw = raw_attribute(owner, attr)
            descriptor = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
            replacement = wrapper(raw.__func__ if descriptor else raw)
            if descriptor:
                replacement = descriptor(replacement)
            return set_attribute(owner, attr, replacement)

        return cls(name=name, target=target, requires=dict(requires), reason=reason, apply_fn=apply_fn)

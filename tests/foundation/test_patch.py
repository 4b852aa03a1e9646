"""Patch records: wrap and undo restore the target exactly, descriptors included (oracle: the object before)."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

import pytest

from torchrec_ascend.injection.patch import Patch, raw_attribute, resolve, set_attribute


def shout(original: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any) -> Any:
        return str(original(*args)).upper()

    return wrapped


def test_resolve_walks_module_and_qualname(new_target_module: Callable[[], ModuleType]) -> None:
    module = new_target_module()
    assert resolve(f"{module.__name__}:Child.klass") == (module.Child, "klass")
    assert resolve(f"{module.__name__}:f0") == (module, "f0")
    with pytest.raises(AttributeError):
        resolve(f"{module.__name__}:Missing.attr")


@pytest.mark.parametrize("owner_name", ["Base", "Child"])
@pytest.mark.parametrize("attr, descriptor", [("static", staticmethod), ("klass", classmethod), ("method", None)])
def test_wrap_keeps_descriptors_and_undo_restores_them(
    new_target_module: Callable[[], ModuleType], owner_name: str, attr: str, descriptor: Any
) -> None:
    module = new_target_module()
    owner = getattr(module, owner_name)
    before = owner.__dict__.get(attr)
    expected = {"static": "static", "klass": owner_name, "method": "method"}[attr]
    expected_for_child = {"static": "static", "klass": "Child", "method": "method"}[attr]
    patch = Patch.wrap("t.wrap", f"{module.__name__}:{owner_name}.{attr}", {}, "test", shout)

    undo = patch.apply()
    if descriptor is not None:
        assert isinstance(owner.__dict__[attr], descriptor), "the descriptor kind must survive wrapping"
    assert getattr(owner(), attr)() == expected.upper()
    assert getattr(module.Child(), attr)() == expected_for_child.upper(), "subclasses see the patch"

    undo()
    assert owner.__dict__.get(attr) is before
    assert getattr(owner(), attr)() == expected


def test_undo_deletes_an_attribute_the_class_only_inherited(new_target_module: Callable[[], ModuleType]) -> None:
    module = new_target_module()
    assert "klass" not in module.Child.__dict__
    undo = Patch.wrap("t.inherited", f"{module.__name__}:Child.klass", {}, "test", shout).apply()
    assert "klass" in module.Child.__dict__
    assert module.Child.klass() == "CHILD", "an inherited classmethod stays bound to the subclass"
    undo()
    assert "klass" not in module.Child.__dict__
    assert module.Child.klass() == "Child"


def test_set_attribute_undo_deletes_what_did_not_exist(new_target_module: Callable[[], ModuleType]) -> None:
    module = new_target_module()
    undo_module = set_attribute(module, "brand_new", 1)
    undo_class = set_attribute(module.Base, "brand_new", 2)
    assert module.brand_new == 1 and module.Base.brand_new == 2
    undo_class()
    undo_module()
    assert not hasattr(module, "brand_new")
    assert not hasattr(module.Base, "brand_new")


def test_raw_attribute_finds_the_descriptor_along_the_mro(new_target_module: Callable[[], ModuleType]) -> None:
    module = new_target_module()
    assert isinstance(raw_attribute(module.Child, "static"), staticmethod)
    assert isinstance(raw_attribute(module.Child, "klass"), classmethod)
    assert raw_attribute(module, "f1") is module.f1


def test_patch_is_a_frozen_record(new_target_module: Callable[[], ModuleType]) -> None:
    module = new_target_module()
    patch = Patch.wrap("t.frozen", f"{module.__name__}:f0", {"torch": ">=2"}, "why", shout)
    assert patch.module == module.__name__
    with pytest.raises(AttributeError):
        patch.name = "other"  # type: ignore[misc]  # frozen: the assignment must raise

"""The one dotted-path resolver. Oracle: the objects the paths name, reached by plain attribute access."""

from __future__ import annotations

import sys

import pytest

import torchrec_ascend.errors
from torchrec_ascend.dotted import resolve_object, resolve_owner, split_path


def test_a_colon_splits_module_and_qualname_else_the_last_dot():
    assert split_path("a.b:C.d") == ("a.b", "C.d")
    assert split_path("torch.npu") == ("torch", "npu")


def test_both_spellings_name_the_same_object_and_the_owner_holds_the_last_name():
    errors = torchrec_ascend.errors
    assert resolve_object("torchrec_ascend.errors:ConfigError") is errors.ConfigError
    assert resolve_object("torchrec_ascend.errors.ConfigError") is errors.ConfigError
    assert resolve_owner("torchrec_ascend.errors:ConfigError.__init__") == (errors.ConfigError, "__init__")


def test_imported_only_imports_nothing_and_misses_quietly(monkeypatch):
    monkeypatch.delitem(sys.modules, "json.tool", raising=False)
    assert resolve_object("json.tool:main", imported_only=True) is None
    assert "json.tool" not in sys.modules
    assert resolve_object("torchrec_ascend.errors:NoSuchError", imported_only=True) is None
    found = resolve_object("torchrec_ascend.errors:ConfigError", imported_only=True)
    assert found is torchrec_ascend.errors.ConfigError


def test_a_missing_name_raises_without_imported_only():
    with pytest.raises(AttributeError):
        resolve_object("torchrec_ascend.errors:NoSuchError")
    with pytest.raises(ImportError):
        resolve_object("torchrec_ascend.no_such_module:x")

"""The version table (torchrec_ascend/versions.py) against the constraints files and the patches' ranges."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Dict

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchrec_ascend import hooks, versions

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints"


def pins(stack: versions.Stack) -> Dict[str, str]:
    lines = (CONSTRAINTS / f"{stack.lane}.txt").read_text().splitlines()
    pairs = [line.split("==") for line in lines if line.strip() and not line.startswith("#")]
    return {name.strip(): version.strip() for name, version in pairs}


@pytest.mark.parametrize("stack", versions.STACKS, ids=lambda s: s.lane)
def test_each_constraints_file_installs_its_row(stack: versions.Stack) -> None:
    pinned = pins(stack)
    assert pinned["torchrec"] == stack.reviewed
    assert pinned["fbgemm-gpu-cpu"] == stack.fbgemm
    assert Version(pinned["torch"]).release[:2] == Version(stack.torch).release[:2]
    assert Version(stack.torch_npu).release[:2] == Version(stack.torch).release[:2], "torch-npu pins its torch minor"


def test_the_installed_stack_is_a_row() -> None:
    """The stack this suite runs on is one the table declares (torch and fbgemm as paired)."""
    row = versions.stack_for(importlib.metadata.version("torchrec"))
    assert row is not None
    assert Version(importlib.metadata.version("torch")).release[:2] == Version(row.torch).release[:2]
    assert importlib.metadata.version("fbgemm-gpu-cpu") == row.fbgemm


def test_every_patch_supports_exactly_the_table() -> None:
    for patch in hooks.default_patches():
        spec = SpecifierSet(patch.requires["torchrec"])
        for stack in versions.STACKS:
            assert stack.reviewed in spec, (patch.name, stack.reviewed)
        assert "1.7.0" not in spec and f"{versions.STACKS[-1].torchrec.split('.')[0]}.99" not in spec


@pytest.mark.parametrize(
    "version, row, newer", [("1.8.0", "1.8", False), ("1.9.1", "1.9", False), ("1.10.0", None, True),
                            ("1.7.2", None, False)],
)
def test_rows_and_newer_versions(version: str, row: str, newer: bool) -> None:
    found = versions.stack_for(version)
    assert (found.torchrec if found else None) == row
    assert versions.newer_than_table(version) is newer
    assert versions.TORCHREC == {"torchrec": ">=1.8.0,<1.10"}

"""The adapters: every TorchRec private name used outside the patches is declared by one, gated and reported.

Oracles: the installed stack is a row of the version table, so every adapter is supported here; a range that
excludes the installed TorchRec, and a private name TorchRec does not define, must be reported; and the source of
the pipeline and the sharders (read with :mod:`ast`) must not touch a declared private name itself.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
from pathlib import Path

import pytest

from torchrec_ascend import adapters
from torchrec_ascend.adapters import train_pipeline
from torchrec_ascend.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[2] / "torchrec_ascend"
TORCHREC = importlib.metadata.version("torchrec")


def test_every_adapter_is_supported_on_this_stack():
    statuses = adapters.report()
    assert [s.adapter.name for s in statuses] == ["a.train_pipeline", "a.sharding", "a.tbe", "a.lookups"]
    assert [(s.state, s.detail) for s in statuses] == [("supported", "")] * len(statuses)


def test_names_are_unique_and_every_private_is_private():
    found = adapters.adapters()
    assert len({a.name for a in found}) == len(found)
    for adapter in found:
        assert all(p.rpartition(".")[2].startswith("_") or p.partition(":")[2].startswith("_")
                   for p in adapter.privates), adapter.name


def test_a_range_without_the_installed_torchrec_is_unsupported_and_refused():
    old = dataclasses.replace(train_pipeline.ADAPTER, requires={"torchrec": "<1.0"})
    status = adapters.check(old)
    assert status.state == "unsupported"
    assert f"torchrec {TORCHREC} is outside the supported range <1.0" in status.detail
    with pytest.raises(ConfigError, match=r"MyPipeline drives TorchRec internals .*a\.train_pipeline"):
        adapters.require(old, "MyPipeline", instead="TorchRec's own pipeline")


def test_a_private_name_torchrec_lacks_is_missing():
    gone = f"{train_pipeline.ADAPTER.target}._no_such_field"
    status = adapters.check(dataclasses.replace(train_pipeline.ADAPTER, privates=(gone,)))
    assert (status.state, status.detail) == ("missing", f"{gone} is not defined")
    assert adapters.missing_private(f"{train_pipeline.ADAPTER.target}._model_attached") == ""  # set in __init__
    assert "ModuleNotFoundError" in adapters.missing_private("torchrec.no_such_module:_f")


def _touched(path: Path, names: set) -> list:
    """``file:line name`` for every attribute access or torchrec/fbgemm import of a name in ``names``."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in names:
            hits.append(f"{path.name}:{node.lineno} {node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("torchrec", "fbgemm_gpu")):
            hits += [f"{path.name}:{node.lineno} {a.name}" for a in node.names if a.name.startswith("_")]
    return hits


@pytest.mark.parametrize("folder", ["pipeline", "sharders", "kernels", "kernels/key_value", "checkpoint"])
def test_the_pipeline_sharders_kernels_and_checkpoints_touch_torchrec_privates_only_through_adapters(folder):
    declared = {p.rpartition(".")[2].rpartition(":")[2] for a in adapters.adapters() for p in a.privates}
    hits = [hit for path in sorted((PACKAGE / folder).glob("*.py")) for hit in _touched(path, declared)]
    assert hits == []


def test_the_scan_sees_a_private_access(tmp_path):
    """Teeth: the scan reports the access the pipeline used to make."""
    probe = tmp_path / "probe.py"
    probe.write_text("from torchrec.distributed.train_pipeline.utils import _fuse_input_dist_splits\n"
                     "def f(forward):\n    return forward._pg\n")
    assert _touched(probe, {"_pg"}) == ["probe.py:1 _fuse_input_dist_splits", "probe.py:3 _pg"]

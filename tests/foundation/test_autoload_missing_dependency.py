"""A dependency of ours missing: ``import torch`` still works, and ``import torchrec`` says in one line what is missing
and the command that installs it.

Each child hides one distribution behind a ``sys.meta_path`` finder that raises ``ModuleNotFoundError`` for it (as if
it were not installed), then imports torch and torchrec. Oracle: torch's own arithmetic, and the stock allow-list
(stock TorchRec refuses ``row_wise`` on CPU; torchrec-ascend, when it is off, must leave TorchRec stock).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Dict

import pytest

from fresh_interpreter import start_all

# HIDDEN: the top-level module made unimportable before anything else is imported.
HIDE = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
"""

PROBE = """
import warnings
import torch
from fresh_interpreter import report
from torchrec_ascend.injection import autoload
facts = {
    "torch_works": torch.ones(2).sum().item() == 2.0,
    "state_after_torch": autoload.STATUS.state,
    "ours_after_torch": sorted(m for m in sys.modules if m.split(".")[0] == "torchrec_ascend"),
}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        import torchrec
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        facts["row_wise_on_cpu"] = "row_wise" in EmbeddingBagCollectionSharder().sharding_types("cpu")
    except ImportError as err:
        facts["import_error"] = str(err)
facts["warnings"] = [str(w.message) for w in caught if "torchrec-ascend" in str(w.message)]
facts["state"], facts["detail"] = autoload.STATUS.state, autoload.STATUS.detail
report(facts)
"""

# What `import torch` may load of ours: the entry point's module and the stdlib-only modules it imports.
ENTRY_POINT_MODULES = {
    "torchrec_ascend",
    "torchrec_ascend.dotted",
    "torchrec_ascend.injection",
    "torchrec_ascend.injection.autoload",
    "torchrec_ascend.injection.import_hook",
}


@pytest.fixture(scope="module")
def children() -> Dict[str, "Future[Dict[str, Any]]"]:
    return start_all({hidden: {"code": f"HIDDEN = {hidden!r}\n" + HIDE + PROBE} for hidden in ("packaging", "pluggy")})


def test_import_torch_survives_a_missing_packaging(children: Dict[str, Future]) -> None:
    """The entry point's module imports nothing that needs ``packaging``: torch imports, the hook is armed."""
    facts = children["packaging"].result()
    assert facts["torch_works"]
    assert facts["state_after_torch"] == "armed"
    assert set(facts["ours_after_torch"]) <= ENTRY_POINT_MODULES


def test_missing_packaging_leaves_torchrec_stock_with_one_line_naming_the_fix(children: Dict[str, Future]) -> None:
    facts = children["packaging"].result()
    assert "import_error" not in facts, facts.get("import_error")
    assert facts["row_wise_on_cpu"] is False, "torchrec-ascend is off: TorchRec must be stock"
    assert facts["state"] == "error"
    assert "No module named 'packaging'" in facts["detail"]
    assert len(facts["warnings"]) == 1, facts["warnings"]
    (warning,) = facts["warnings"]
    assert "\n" not in warning
    assert "packaging, which is not installed" in warning
    assert 'pip install "packaging>=23"' in warning


def test_missing_pluggy_fails_import_torchrec_with_one_line_naming_the_fix(children: Dict[str, Future]) -> None:
    """pluggy loads the device backends: without it torchrec-ascend cannot pick one, so ``import torchrec`` fails
    (a backend must never silently fall back), saying what to install; ``import torch`` still works."""
    facts = children["pluggy"].result()
    assert facts["torch_works"]
    assert facts["state_after_torch"] == "armed"
    error = facts["import_error"]
    assert "\n" not in error
    assert "pluggy, which is not installed" in error
    assert 'pip install "pluggy>=1.5"' in error

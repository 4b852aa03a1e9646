"""A broken install: ``import torch`` still works, and ``import torchrec`` (or ``doctor``) says in one line what is
wrong and the command that fixes it.

Each child hides one distribution behind a ``sys.meta_path`` finder that raises ``ModuleNotFoundError`` for it (as if
it were not installed), or puts a stand-in for the CUDA ``fbgemm-gpu`` first on the path (its metadata, and a package
whose import fails as the real one does without the CUDA runtime), then imports torch and torchrec. Oracle: torch's
own arithmetic, and the stock allow-list (stock TorchRec refuses ``row_wise`` on CPU; torchrec-ascend, when it is
off, must leave TorchRec stock).

Not covered, because no package can cover it: a numpy that raises ``ImportError`` on import (not
``ModuleNotFoundError``) makes torch's own ``torch/storage.py`` fail, with or without torchrec-ascend installed.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

from fresh_interpreter import start_all
from torchrec_ascend import versions

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


# What `import torchrec` raised, with the notes Python prints under it, and what doctor found.
IMPORT_AND_DOCTOR = """
import torch
from fresh_interpreter import report
facts = {"torch_works": torch.ones(2).sum().item() == 2.0}
try:
    import torchrec
except Exception as err:
    facts["error"] = f"{type(err).__name__}: {err}"
    facts["notes"] = list(getattr(err, "__notes__", []))
from torchrec_ascend.cli import doctor
facts["problems"] = doctor.diagnose().problems
report(facts)
"""

# The CUDA build of fbgemm-gpu on a CPU machine: its metadata, and a package that fails as its library does.
CUDA_FBGEMM_ERROR = "libcudart.so.12: cannot open shared object file: No such file or directory"


def cuda_fbgemm_standin(root: Path) -> Path:
    (root / "fbgemm_gpu").mkdir(parents=True)
    (root / "fbgemm_gpu" / "__init__.py").write_text(f"raise OSError({CUDA_FBGEMM_ERROR!r})\n")
    metadata = root / "fbgemm_gpu-1.8.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: fbgemm-gpu\nVersion: 1.8.0\n")
    return root


@pytest.fixture(scope="module")
def children(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, "Future[Dict[str, Any]]"]:
    programs: Dict[str, Dict[str, Any]] = {
        hidden: {"code": f"HIDDEN = {hidden!r}\n" + HIDE + PROBE} for hidden in ("packaging", "pluggy")
    }
    for hidden in ("torchrec", "tensordict"):
        programs[hidden] = {"code": f"HIDDEN = {hidden!r}\n" + HIDE + IMPORT_AND_DOCTOR}
    standin = cuda_fbgemm_standin(tmp_path_factory.mktemp("cuda-fbgemm"))
    programs["cuda fbgemm"] = {"code": f"import sys; sys.path.insert(0, {str(standin)!r})\n" + IMPORT_AND_DOCTOR}
    return start_all(programs)


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


def test_missing_torchrec_doctor_names_the_install_command(children: Dict[str, Future]) -> None:
    """torchrec left out (it is not in our metadata: its own pulls the CUDA fbgemm-gpu): doctor says to install the
    release of the stack the installed torch pairs with, with --no-deps."""
    facts = children["torchrec"].result()
    assert facts["torch_works"]
    assert facts["error"] == "ModuleNotFoundError: No module named 'torchrec'"
    (fix,) = [p for p in facts["problems"] if "fix:" in p]
    stack = next(s for s in versions.STACKS if torch.__version__.startswith(s.torch + "."))
    assert fix.startswith("torchrec is not installed; ")
    assert f'pip install --no-deps "torchrec=={stack.torchrec}.*"' in fix


def test_missing_torchrec_dependency_is_a_note_on_the_import_error(children: Dict[str, Future]) -> None:
    """One of torchrec's own dependencies missing (what `--no-deps` leaves out): the error is TorchRec's, unchanged,
    with one note under it naming our extra that brings it."""
    facts = children["tensordict"].result()
    assert facts["error"] == "ModuleNotFoundError: No module named 'tensordict'"
    (note,) = facts["notes"]
    assert note.startswith("torchrec-ascend: torchrec needs tensordict, which is not installed")
    assert note.endswith('fix: pip install "torchrec-ascend[cpu]"')
    assert any(p == note.removeprefix("torchrec-ascend: ") for p in facts["problems"]), facts["problems"]


def test_cuda_fbgemm_on_a_cpu_torch_is_named_with_the_swap_that_fixes_it(children: Dict[str, Future]) -> None:
    facts = children["cuda fbgemm"].result()
    assert facts["torch_works"]
    assert facts["error"] == f"OSError: {CUDA_FBGEMM_ERROR}"
    (note,) = facts["notes"]
    stack = next(s for s in versions.STACKS if torch.__version__.startswith(s.torch + "."))
    assert "the CUDA build of fbgemm-gpu is installed on a machine without CUDA" in note
    swap = f'pip uninstall -y fbgemm-gpu fbgemm-gpu-cpu && pip install "fbgemm-gpu-cpu=={stack.fbgemm}"'
    assert note.endswith(f"fix: {swap}")
    assert "\n" not in note
    assert note.removeprefix("torchrec-ascend: ") in facts["problems"], facts["problems"]

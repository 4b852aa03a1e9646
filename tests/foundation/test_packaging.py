"""Packaging: the sdist holds what setup.py compiles, and native ops built for another torch fail with the fix.

The wheel itself is built, installed into a new venv and run (doctor, conformance) by ``scripts/check-wheel``, which
CI runs (``.ci/run``); building one takes about 2 minutes here, so these tests check the cheap parts:

* ``setup.py sdist`` in a copy of the package's files: every C++ source and header of both native libraries is in
  it (oracle: the files in the repository), no build output is;
* a native library that fails to load (as on a torch it was not built for: undefined symbols) leaves ``import torch``
  and ``import torchrec`` working; importing the ops raises one ImportError naming the torch the wheel was built for,
  the installed torch and the command that fixes it; ``doctor`` shows the same and does not crash.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE_SOURCES = ("kernels/csrc", "torchrec_ascend/testing/csrc")


def test_the_sdist_holds_every_native_source_and_no_build_output(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("torchrec_ascend", "kernels", "constraints"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=src,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    wanted = {str(p.relative_to(ROOT)) for folder in NATIVE_SOURCES for p in (ROOT / folder).rglob("*")
              if p.is_file() and p.suffix in (".cpp", ".h")}
    assert wanted and not wanted - names, sorted(wanted - names)
    assert {"constraints/tr18.txt", "constraints/tr19.txt", "torchrec_ascend/native/library.py"} <= names
    assert not [n for n in names if n.endswith((".so", ".o", ".pyc"))]


#: Run in a fresh interpreter: the ops library "fails to load" as on another torch, and a wheel's built_for says 2.99.
BROKEN_LIBRARY = textwrap.dedent(
    """\
    import importlib.abc, sys, types

    class Broken(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torchrec_ascend.native._C":
                raise ImportError("_C.so: undefined symbol: _ZN3c1015SmallVectorBase")
            return None

    sys.meta_path.insert(0, Broken())
    built_for = types.ModuleType("torchrec_ascend.native.built_for")
    built_for.TORCH = "2.99.0+cpu"
    sys.modules["torchrec_ascend.native.built_for"] = built_for
    import torch
    import torchrec  # noqa: F401
    print("imports: ok")
    from torchrec_ascend.native import library
    try:
        from torchrec_ascend.native import ops  # noqa: F401
    except library.NativeLibraryError as err:
        print("error:", err)
    from torchrec_ascend.cli import doctor
    diagnosis = doctor.diagnose()
    print("doctor:", [line for line in diagnosis.text.splitlines() if line.startswith("Native ops")])
    print("problems:", diagnosis.problems)
    """
)


def test_native_ops_built_for_another_torch_say_which_torch_they_need() -> None:
    import torch

    proc = subprocess.run([sys.executable, "-c", BROKEN_LIBRARY], capture_output=True, text=True, timeout=300,
                          cwd="/")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "imports: ok" in lines
    (error,) = [line for line in lines if line.startswith("error: ")]
    assert f"cannot be loaded on torch {torch.__version__}" in error
    assert "undefined symbol" in error and "built for torch 2.99.0+cpu" in error
    assert "pip install 'torch" in error  # the fix
    assert "doctor: ['Native ops: NOT LOADED (see Errors)']" in lines
    (problems,) = [line for line in lines if line.startswith("problems: ")]
    assert "built for torch 2.99.0+cpu" in problems


@pytest.mark.parametrize("script", ["check-wheel", "setup-env", "run-main-job"])
def test_the_scripts_parse(script: str) -> None:
    proc = subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

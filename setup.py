"""Build script: the package is the folder ``torchrec_ascend/`` (no folder-to-namespace remap), plus the native ops.

Layers, lowest first: tests/foundation/test_layering.py. The C++ sources of ``torch.ops.torchrec_ascend`` stay in the
top-level ``kernels/csrc/`` (the design card) and build into ``torchrec_ascend.native._C``; the built-in policies are
``torchrec_ascend/policies/builtin/`` (loaded through the entry point only); ``conformance_tests`` at the top level is
a link to ``torchrec_ascend/conformance_tests/``.

Two native libraries: the ops (always) and the emulated NPU ``torchrec_ascend.testing._emulator`` (tests and
``conformance --emulate``). ``TORCHREC_ASCEND_EMULATOR=0`` leaves the emulator out (``scripts/run-main-job`` does:
the main job never uses it, and it is half the compile). Wheels always hold both (``scripts/check-wheel``).

Built without build isolation (``pip wheel --no-build-isolation .``, ``python -m build --no-isolation``): the
libraries compile against the installed torch, and the distribution requires that torch's minor (``torch==2.13.*``):
a wheel built against one torch minor does not load fully on another. The wheel records that torch in
``torchrec_ascend/native/built_for.py`` so a load on another torch says which one it needs
(``torchrec_ascend.native.library``). ``TORCHREC_ASCEND_BUILD_TEMP``: a folder kept for the object files, so a
second build of the same sources and flags from the same tree compiles nothing (``scripts/setup-env`` and
``scripts/check-wheel`` share one per stack).
"""

import os
from pathlib import Path
from typing import List

import torch
from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from torch.utils.cpp_extension import BuildExtension, CppExtension

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

#: The torch minors the native sources build against (torchrec_ascend/versions.py, one per supported stack).
SUPPORTED_TORCH = ("2.13", "2.14")


def dependencies() -> List[str]:
    """pyproject.toml's ``[tool.torchrec-ascend] dependencies`` and ``torch==<minor>.*`` of the torch built against."""
    minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if minor not in SUPPORTED_TORCH:
        raise SystemExit(f"torchrec-ascend builds against torch {' or '.join(SUPPORTED_TORCH)}; this environment has "
                         f"torch {torch.__version__}: install a supported one (constraints/tr18.txt, tr19.txt)")
    with open(Path(__file__).parent / "pyproject.toml", "rb") as f:
        own = tomllib.load(f)["tool"]["torchrec-ascend"]["dependencies"]
    return [f"torch=={minor}.*", *own]


def native_extension(name: str, folder: str) -> List[CppExtension]:
    """The extension ``name`` built from every ``*.cpp`` under ``folder`` (none if the folder has no sources).

    No ``-std=`` flag: BuildExtension then adds the standard of the installed torch's own build (``-std=c++20`` for
    torch 2.13 and 2.14; 2.14's headers refuse anything older), so one setup.py builds against every supported torch.
    An explicit ``-std=`` would stop BuildExtension from adding its own. With ninja on the PATH (``pip install
    ninja``) the sources compile in parallel (``MAX_JOBS``, default: cores + 2).
    """
    sources = sorted(str(p) for p in Path(folder).rglob("*.cpp"))
    # -g0 overrides the -g of Python's own CFLAGS: debug info for torch's headers doubles each compile (46 s -> 21 s
    # for one source here) and the size of the libraries.
    return [CppExtension(name, sources, extra_compile_args=["-O3", "-g0"])] if sources else []


class BuildPyRecordingTorch(build_py):
    """build_py that also writes ``native/built_for.py``: the torch the native libraries are compiled against."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable install builds from the tree: scripts/setup-env rebuilds it
            target = Path(self.build_lib, "torchrec_ascend", "native", "built_for.py")
            target.write_text(f'"""Written by setup.py: the torch this build compiled against."""\n\n'
                              f'TORCH = "{torch.__version__}"\n')


ext_modules = native_extension("torchrec_ascend.native._C", "kernels/csrc")
if os.environ.get("TORCHREC_ASCEND_EMULATOR", "1") != "0":
    ext_modules += native_extension("torchrec_ascend.testing._emulator", "torchrec_ascend/testing/csrc")

class BuildExtensionKeepingObjects(BuildExtension):
    """BuildExtension with its object files in ``$TORCHREC_ASCEND_BUILD_TEMP`` when set (ninja then skips the
    compiles whose sources and commands are unchanged; an editable install otherwise compiles in a new temporary
    folder each time)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if os.environ.get("TORCHREC_ASCEND_BUILD_TEMP"):
            self.build_temp = os.environ["TORCHREC_ASCEND_BUILD_TEMP"]


setup(
    packages=find_packages(include=["torchrec_ascend", "torchrec_ascend.*"]),
    install_requires=dependencies(),
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtensionKeepingObjects, "build_py": BuildPyRecordingTorch},
)

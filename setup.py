"""Build script: the package is the folder ``torchrec_ascend/`` (no folder-to-namespace remap), plus the native ops.

Layers, lowest first: tests/foundation/test_layering.py. The C++ sources of ``torch.ops.torchrec_ascend`` stay in the
top-level ``kernels/csrc/`` (the design card) and build into ``torchrec_ascend.native._C``; the built-in policies are
``torchrec_ascend/policies/builtin/`` (loaded through the entry point only); ``conformance_tests`` at the top level is
a link to ``torchrec_ascend/conformance_tests/``.

Two native libraries: the ops (always) and the emulated NPU ``torchrec_ascend.testing._emulator`` (tests and
``conformance --emulate``). ``TORCHREC_ASCEND_EMULATOR=0`` leaves the emulator out (``scripts/run-main-job`` does:
the main job never uses it, and it is half the compile). Wheels always hold both (``scripts/check-wheel``).

Built without build isolation (``pip wheel --no-build-isolation .``, ``python -m build --no-isolation``): the
libraries compile against the installed torch. The wheel records that torch in ``torchrec_ascend/native/built_for.py``
so a load on another torch says which one it needs (``torchrec_ascend.native.library``).
"""

import os
from pathlib import Path
from typing import List

import torch
from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from torch.utils.cpp_extension import BuildExtension, CppExtension


def native_extension(name: str, folder: str) -> List[CppExtension]:
    """The extension ``name`` built from every ``*.cpp`` under ``folder`` (none if the folder has no sources).

    No ``-std=`` flag: BuildExtension then adds the standard of the installed torch's own build (``-std=c++20`` for
    torch 2.13 and 2.14; 2.14's headers refuse anything older), so one setup.py builds against every supported torch.
    An explicit ``-std=`` would stop BuildExtension from adding its own. With ninja on the PATH (``pip install
    ninja``) the sources compile in parallel (``MAX_JOBS``, default: cores + 2).
    """
    sources = sorted(str(p) for p in Path(folder).rglob("*.cpp"))
    return [CppExtension(name, sources, extra_compile_args=["-O3"])] if sources else []


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

setup(
    packages=find_packages(include=["torchrec_ascend", "torchrec_ascend.*"]),
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension, "build_py": BuildPyRecordingTorch},
)

"""Build script: the package is the folder ``torchrec_ascend/`` (no folder-to-namespace remap), plus the native ops.

Layers, lowest first: tests/foundation/test_layering.py. The C++ sources of ``torch.ops.torchrec_ascend`` stay in the
top-level ``kernels/csrc/`` (the design card) and build into ``torchrec_ascend.native._C``; the built-in policies are
``torchrec_ascend/policies/builtin/`` (loaded through the entry point only); ``conformance_tests`` at the top level is
a link to ``torchrec_ascend/conformance_tests/``.
"""

from pathlib import Path
from typing import List

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension


def native_extension(name: str, folder: str) -> List[CppExtension]:
    """The extension ``name`` built from every ``*.cpp`` under ``folder`` (none if the folder has no sources).

    No ``-std=`` flag: BuildExtension then adds the standard of the installed torch's own build (``-std=c++20`` for
    torch 2.13 and 2.14; 2.14's headers refuse anything older), so one setup.py builds against every supported torch.
    An explicit ``-std=`` would stop BuildExtension from adding its own.
    """
    sources = sorted(str(p) for p in Path(folder).rglob("*.cpp"))
    return [CppExtension(name, sources, extra_compile_args=["-O3"])] if sources else []


packages = find_packages(include=["torchrec_ascend", "torchrec_ascend.*"])

setup(
    packages=packages,
    # One line per native library.
    ext_modules=[
        *native_extension("torchrec_ascend.native._C", "kernels/csrc"),
        *native_extension("torchrec_ascend.testing._emulator", "torchrec_ascend/testing/csrc"),
    ],
    cmdclass={"build_ext": BuildExtension},
)

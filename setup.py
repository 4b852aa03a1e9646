"""Build script: maps the top-level folders into the one `torchrec_ascend` namespace and compiles the native ops.

Folder -> import name (see README, "Layout"):
    torchrec_ascend/   -> torchrec_ascend
    kernels/           -> torchrec_ascend.kernels          (compute kernels and the native op sources)
    plugins/builtin/   -> torchrec_ascend.policies.builtin (built-in policy plugins, loaded via entry point)
    conformance_tests/ -> torchrec_ascend.conformance_tests
"""

from pathlib import Path
from typing import List

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOTS = {
    "torchrec_ascend": "torchrec_ascend",
    "torchrec_ascend.kernels": "kernels",
    "torchrec_ascend.policies.builtin": "plugins/builtin",
    "torchrec_ascend.conformance_tests": "conformance_tests",
}


def packages_and_dirs():
    packages, package_dir = [], {}
    for name, folder in ROOTS.items():
        packages.append(name)
        package_dir[name] = folder
        for sub in find_packages(folder):
            packages.append(f"{name}.{sub}")
    return packages, package_dir


def native_extension(name: str, folder: str) -> List[CppExtension]:
    """The extension ``name`` built from every ``*.cpp`` under ``folder`` (none if the folder has no sources).

    No ``-std=`` flag: BuildExtension then adds the standard of the installed torch's own build (``-std=c++20`` for
    torch 2.13 and 2.14; 2.14's headers refuse anything older), so one setup.py builds against every supported torch.
    An explicit ``-std=`` would stop BuildExtension from adding its own.
    """
    sources = sorted(str(p) for p in Path(folder).rglob("*.cpp"))
    return [CppExtension(name, sources, extra_compile_args=["-O3"])] if sources else []


packages, package_dir = packages_and_dirs()

setup(
    packages=packages,
    package_dir=package_dir,
    # One line per native library.
    ext_modules=[
        *native_extension("torchrec_ascend.kernels._C", "kernels/csrc"),
        *native_extension("torchrec_ascend.testing._emulator", "torchrec_ascend/testing/csrc"),
    ],
    cmdclass={"build_ext": BuildExtension},
)

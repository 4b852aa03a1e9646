"""Build script: maps the top-level folders into the one `torchrec_ascend` namespace and compiles the native ops.

Folder -> import name (see README, "Layout"):
    torchrec_ascend/   -> torchrec_ascend
    kernels/           -> torchrec_ascend.kernels          (compute kernels and the native op sources)
    plugins/builtin/   -> torchrec_ascend.policies.builtin (built-in policy plugins, loaded via entry point)
    conformance_tests/ -> torchrec_ascend.conformance_tests
"""

from pathlib import Path

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


packages, package_dir = packages_and_dirs()
native_sources = sorted(str(p) for p in Path("kernels/csrc").rglob("*.cpp"))

setup(
    packages=packages,
    package_dir=package_dir,
    ext_modules=[
        CppExtension(
            "torchrec_ascend.kernels._C",
            native_sources,
            extra_compile_args=["-O3", "-std=c++17"],
        )
    ]
    if native_sources
    else [],
    cmdclass={"build_ext": BuildExtension},
)

"""The package's layers: every module imports only its own layer and the layers below it, and the repository root
imports the source tree (no folder-to-namespace remap).

The oracle is the source itself: every ``import`` of ``torchrec_ascend...`` in every module of the package, found
with :mod:`ast` (module level and inside functions; imports under ``if TYPE_CHECKING:`` are annotations only and
are not counted), mapped to the layer of the module it names.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "torchrec_ascend"

#: Lowest first. A module may import its own layer and any layer listed before it. Keys are the first name below
#: ``torchrec_ascend`` (a sub-package or a top-level module); "" is the package root's lazy public names.
LAYERS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("foundation", ("errors", "versions", "shutdown", "dotted")),
    ("datasets", ("datasets",)),
    ("native ops", ("native",)),
    ("TorchRec adapters", ("adapters",)),
    ("plugin system", ("hookspecs", "plugin_manager")),
    ("backends", ("backends",)),
    ("policies", ("policies",)),
    ("hash tables", ("hash",)),
    ("compute kernels", ("kernels",)),
    ("sharders", ("sharders",)),
    ("checkpoints", ("checkpoint",)),
    ("injection", ("injection", "hooks")),
    ("pipeline", ("pipeline",)),
    ("testing", ("testing",)),
    ("front ends", ("cli", "conformance_tests", "")),
)

#: Upward imports that remain, each with the issue item that removes it. Keep this list short and explained.
ALLOWED_UPWARD: Dict[Tuple[str, str], str] = {}

LAYER_OF = {key: index for index, (_, keys) in enumerate(LAYERS) for key in keys}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> Dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imported(path: Path, name: str, modules: Dict[str, Path]) -> Iterator[Tuple[int, str]]:
    """(line, module) for every runtime import of ours in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST) -> Iterator[Tuple[int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child):
                yield from (item for n in child.orelse for item in visit_one(n))
                continue
            yield from visit_one(child)

    def visit_one(child: ast.AST) -> Iterator[Tuple[int, str]]:
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield child.lineno, alias.name
        elif isinstance(child, ast.ImportFrom):
            if child.level:
                base = package.split(".")[: len(package.split(".")) - child.level + 1]
                source = ".".join(base + ([child.module] if child.module else []))
            else:
                source = child.module or ""
            for alias in child.names:  # `from pkg import sub` names the sub-module when there is one
                sub = f"{source}.{alias.name}"
                yield child.lineno, sub if sub in modules else source
        yield from visit(child)

    for line, target in visit(ast.parse(path.read_text(), str(path))):
        if target == "torchrec_ascend" or target.startswith("torchrec_ascend."):
            yield line, target


def layer_key(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_folder_and_module_has_a_layer():
    keys = {layer_key(name) for name in package_modules()}
    missing = sorted(keys - set(LAYER_OF))
    assert not missing, f"place {missing} in LAYERS of {Path(__file__).name} (lowest first), and in the README table"


def test_imports_flow_one_way():
    modules = package_modules()
    upward: List[str] = []
    for name, path in modules.items():
        own = LAYER_OF[layer_key(name)]
        for line, target in imported(path, name, modules):
            theirs = LAYER_OF.get(layer_key(target), own)
            allowed = any(name == a and (target == b or target.startswith(b + ".")) for a, b in ALLOWED_UPWARD)
            if theirs > own and not allowed:
                upward.append(f"{path.relative_to(REPO)}:{line}: {name} ({LAYERS[own][0]}) imports {target} "
                              f"({LAYERS[theirs][0]})")
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_allowed_upward_imports_still_exist():
    """An exception that is no longer needed is removed from ALLOWED_UPWARD (the list only shrinks)."""
    modules = package_modules()
    for (source, target), why in ALLOWED_UPWARD.items():
        found = [t for _, t in imported(modules[source], source, modules) if t == target or t.startswith(target + ".")]
        assert found, f"{source} no longer imports {target}: drop its ALLOWED_UPWARD entry ({why})"


def test_the_layering_check_sees_an_upward_import(tmp_path):
    """Teeth: a hash-table module importing a compute kernel is reported."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from torchrec_ascend.kernels.fused import HashRows\n")
    modules = package_modules()
    targets = [t for _, t in imported(probe, "torchrec_ascend.hash.probe", modules)]
    assert targets == ["torchrec_ascend.kernels.fused"]
    assert LAYER_OF[layer_key(targets[0])] > LAYER_OF["hash"]


def test_builtin_policies_load_only_through_their_entry_point():
    """Nothing in the package imports the built-ins (the registry finds them through ``builtin_policies``); the
    conformance suite may, to check them one by one."""
    modules = package_modules()
    direct = [f"{path.relative_to(REPO)}:{line}" for name, path in modules.items()
              if not name.startswith(("torchrec_ascend.policies.builtin", "torchrec_ascend.conformance_tests"))
              for line, target in imported(path, name, modules)
              if target.startswith("torchrec_ascend.policies.builtin")]
    assert not direct, f"import the built-in policies through the registry, not directly: {direct}"


def test_no_remapped_folders():
    """The folder is the import name: no Python outside the package except examples, tests, benchmarks, plugins."""
    assert not list((REPO / "kernels").glob("**/*.py")), "kernels/ holds the C++ sources only"
    for child in (REPO / "plugins").iterdir():
        if child.is_dir():
            assert (child / "pyproject.toml").is_file(), f"plugins/{child.name} is not an installable distribution"
    assert "package_dir" not in (REPO / "setup.py").read_text()
    link = REPO / "conformance_tests"
    assert link.is_symlink() and link.resolve() == (PACKAGE / "conformance_tests").resolve()


def test_repository_root_imports_the_source_tree():
    """From the repository root, the tree's own modules import (and the built-in policies' entry point loads)."""
    code = (
        "import importlib.metadata, torchrec_ascend.policies.builtin, torchrec_ascend.kernels, "
        "torchrec_ascend.conformance_tests, torchrec_ascend.native.reference\n"
        "eps = {ep.name: ep for ep in importlib.metadata.entry_points(group='torchrec_ascend')}\n"
        "assert eps['builtin_policies'].load() is torchrec_ascend.policies.builtin\n"
        "print(torchrec_ascend.policies.builtin.__file__, torchrec_ascend.kernels.__file__, "
        "torchrec_ascend.conformance_tests.__file__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for file in result.stdout.split():
        assert Path(file).resolve().is_relative_to(PACKAGE.resolve()), f"{file} is not from {PACKAGE}"

"""Drift detection: a digest of each patch target's source, compared with the digests recorded when it was reviewed.

A target's source is found in its module's file with :mod:`ast`, never from the live object, so the digest is the
same before and after a patch replaced it: ``module:Class.attr`` is the definition in that class's body (or in the
first base class defining it), a name a module imported (``from x import f``) is followed to its definition. The
digest is the SHA-256 (first 16 hex digits) of the definition's exact source lines, decorators included.

Example::

    target_digest("torchrec.distributed.utils:sharded_model_copy.__enter__")   # '3f0c...'
    check(patch, {"1.8.0": "3f0c..."})       # Drift(state='reviewed', digest='3f0c...', matched='1.8.0')

Recording a reviewed TorchRec: install its stack, read the diff of every target whose digest changed, then
``python -m torchrec_ascend.injection.drift --record`` adds the installed digests to
:mod:`torchrec_ascend.hooks.reviewed` (``git diff`` shows what was recorded). Without ``--record`` it prints them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

from torchrec_ascend.injection.patch import Patch, resolve


@dataclasses.dataclass(frozen=True)
class Drift:
    """How an installed patch target compares with its reviewed digests.

    Attributes:
        state: ``reviewed`` (the digest equals one recorded), ``drifted`` (it equals none), ``unreviewed`` (nothing
            is recorded for this patch) or ``missing`` (the target's source cannot be found).
        digest: the installed target's digest ('' when missing).
        matched: the reviewed TorchRec version whose digest it equals ('' unless reviewed).
        detail: for ``missing``, why.
    """

    state: str
    digest: str
    matched: str = ""
    detail: str = ""


def _module_tree(module: str) -> Tuple[ast.Module, List[str]]:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise LookupError(f"no Python source for module {module}")
    with open(spec.origin, encoding="utf-8") as handle:
        source = handle.read()
    return ast.parse(source), source.splitlines()


def _find(body: List[ast.stmt], name: str) -> Optional[ast.stmt]:
    """The last statement of ``body`` binding ``name`` (a later definition wins, as at runtime)."""
    found: Optional[ast.stmt] = None
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = node
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            found = node
        elif isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            found = node
    return found


def _imported_from(node: ast.ImportFrom, module: str, name: str) -> str:
    alias = next(a for a in node.names if (a.asname or a.name) == name)
    base = node.module or ""
    if node.level:
        package = module.rsplit(".", node.level)[0]
        base = f"{package}.{base}" if base else package
    return f"{base}:{alias.name}"


def target_source(target: str) -> str:
    """The exact source lines defining ``target`` (``"module:qualname"``), decorators included.

    Raises:
        LookupError: the module has no Python source, or no definition of a name on the path.
    """
    module, _, qualname = target.partition(":")
    tree, lines = _module_tree(module)
    body: List[ast.stmt] = tree.body
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        node = _find(body, part)
        if isinstance(node, ast.ImportFrom):
            source_module, _, name = _imported_from(node, module, part).partition(":")
            return target_source(f"{source_module}:{'.'.join([name, *parts[i + 1 :]])}")
        if node is None and i == len(parts) - 1 and i > 0:
            return _inherited_source(module, parts)
        if node is None:
            raise LookupError(f"{target}: {'.'.join(parts[: i + 1])} is not defined in {module}")
        if i < len(parts) - 1:
            if not isinstance(node, ast.ClassDef):
                raise LookupError(f"{target}: {'.'.join(parts[: i + 1])} is not a class in {module}")
            body = node.body
    assert node is not None  # the last part was found (the loop raises otherwise)
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return "\n".join(lines[first - 1 : node.end_lineno])


def _inherited_source(module: str, parts: List[str]) -> str:
    owner, attr = resolve(f"{module}:{'.'.join(parts)}")
    if inspect.isclass(owner):
        for base in owner.__mro__[1:]:
            try:
                return target_source(f"{base.__module__}:{base.__qualname__}.{attr}")
            except LookupError:
                continue
    raise LookupError(f"{module}:{'.'.join(parts)} is not defined in {module} nor in a base class")


@functools.lru_cache(maxsize=None)
def target_digest(target: str) -> str:
    """SHA-256 (16 hex digits) of :func:`target_source` (cached: sources do not change within a process).

    Raises:
        LookupError: as :func:`target_source`.
    """
    return hashlib.sha256(target_source(target).encode("utf-8")).hexdigest()[:16]


def check(patch: Patch, reviewed: Optional[Mapping[str, str]], version: str = "") -> Drift:
    """Compare ``patch``'s installed target with ``reviewed`` (TorchRec version -> digest).

    Args:
        patch: the patch whose target is checked.
        reviewed: its reviewed digests.
        version: the reviewed TorchRec release to compare with (the installed TorchRec's row); '' (or a version
            not recorded): any reviewed release matches.
    """
    try:
        digest = target_digest(patch.target)
    except (LookupError, ImportError, AttributeError, SyntaxError, OSError) as err:  # OSError: a library fails to load
        return Drift("missing", "", detail=f"{type(err).__name__}: {err}")
    if not reviewed:
        return Drift("unreviewed", digest)
    candidates = {version: reviewed[version]} if version in reviewed else reviewed
    matched = next((v for v, value in candidates.items() if value == digest), "")
    return Drift("reviewed" if matched else "drifted", digest, matched)


def reviewed_digests() -> Dict[str, Dict[str, str]]:
    """Patch name -> {reviewed TorchRec version -> digest}, from :mod:`torchrec_ascend.hooks.reviewed`."""
    from torchrec_ascend.hooks import reviewed

    table: Dict[str, Dict[str, Any]] = reviewed.REVIEWED
    return {name: dict(entry["digests"]) for name, entry in table.items()}


def installed_digests(patches: List[Patch]) -> dict:
    """``{patch name: {"target": ..., "digest": ...}}`` for the installed TorchRec (to review and record)."""
    return {p.name: {"target": p.target, "digest": check(p, None).digest} for p in patches}


def render_reviewed(entries: Mapping[str, Mapping[str, object]]) -> str:
    """The source of :mod:`torchrec_ascend.hooks.reviewed` holding ``entries`` (patch name -> target, digests)."""
    body = json.dumps(dict(entries), indent=4, sort_keys=False)
    return (
        '"""Reviewed digests of every patch target\'s source, per TorchRec release (data; see\n'
        ":mod:`torchrec_ascend.injection.drift`). Written by ``python -m torchrec_ascend.injection.drift --record``\n"
        'after reviewing the targets that changed; never edit a digest by hand."""\n\n'
        f"REVIEWED = {body}\n"
    )


def main(argv: Optional[List[str]] = None) -> None:
    """Print (or, with ``--record``, record) the installed digests of every default patch."""
    import argparse

    from torchrec_ascend import hooks
    from torchrec_ascend.hooks import reviewed

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--record", action="store_true", help="add them to torchrec_ascend/hooks/reviewed.py")
    args = parser.parse_args(argv)
    version = importlib.metadata.version("torchrec")
    found = installed_digests(hooks.default_patches())
    if not args.record:
        print(json.dumps({"torchrec": version, "patches": found}, indent=1))
        return
    table: Dict[str, Dict[str, Any]] = reviewed.REVIEWED
    entries = {name: dict(entry) for name, entry in table.items()}
    for name, entry in found.items():
        if not entry["digest"]:
            raise SystemExit(f"{name}: the source of {entry['target']} cannot be found; nothing recorded")
        record = entries.setdefault(name, {"target": entry["target"], "digests": {}})
        record["target"] = entry["target"]
        record["digests"] = {**record.get("digests", {}), version: entry["digest"]}
    with open(reviewed.__file__, "w", encoding="utf-8") as handle:
        handle.write(render_reviewed(entries))
    print(f"recorded the digests of {len(found)} patch targets on torchrec {version} in {reviewed.__file__}")


if __name__ == "__main__":
    main()

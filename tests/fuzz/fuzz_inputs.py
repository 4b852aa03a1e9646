"""Shared pieces of the fuzz tests: hostile JSON values, mutations of JSON trees and files, a guard that records
every file a reader opens, and the example budget (``TORCHREC_ASCEND_FUZZ_EXAMPLES``; ``scripts/fuzz-long`` raises it).

Example::

    with OpenedFiles() as opened:
        read_everything(root)
    assert opened.outside(root) == []
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, List, Sequence, Tuple

from hypothesis import strategies as st

#: Examples per fuzz test: bounded in CI (HYPOTHESIS_PROFILE=ci keeps every fuzz file to a few seconds).
EXAMPLES = int(os.environ.get("TORCHREC_ASCEND_FUZZ_EXAMPLES", "25"))

HOSTILE_VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, -1, -(2**63), 2**63, 2**70, 10**30, 1.5, -0.0, float("nan"),
                     float("inf"), 1e308, "", "..", "../", "/", "/etc/passwd", "../elsewhere/rank-00000-of-00001.data",
                     "a/b", "a\\b", "x\x00y", "|O", "<f16", "(2,)i4", "V8", [], {}, [None], [-1], [2**40, 2**40],
                     {"a": 1}, "shape:[1e9]", "shape:[1,,2]", "nonsense"]),
    st.integers(), st.floats(allow_nan=True), st.text(max_size=12),
    st.lists(st.integers(-3, 2**31), max_size=4),
)


class _Guard:
    """One audit hook for the whole process (hooks cannot be removed); it records opens while a guard is active."""

    active: List["OpenedFiles"] = []
    lock = threading.Lock()
    installed = False

    @classmethod
    def install(cls) -> None:
        with cls.lock:
            if not cls.installed:
                sys.addaudithook(cls.hook)
                cls.installed = True

    @classmethod
    def hook(cls, event: str, args: Tuple[Any, ...]) -> None:
        if event == "open" and cls.active and isinstance(args[0], (str, bytes, os.PathLike)):
            for guard in cls.active:
                guard.paths.append(os.fsdecode(args[0]))


class OpenedFiles:
    """Context manager recording every path opened (``open``/``os.open``) while it is active."""

    def __init__(self) -> None:
        self.paths: List[str] = []

    def __enter__(self) -> "OpenedFiles":
        _Guard.install()
        _Guard.active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _Guard.active.remove(self)

    def outside(self, folder: str) -> List[str]:
        """Opened paths whose real location is not inside ``folder`` (also real-pathed)."""
        root = os.path.realpath(folder)
        return [p for p in self.paths if os.path.commonpath([os.path.realpath(p), root]) != root]


def json_paths(tree: Any, prefix: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    """Every path (tuple of keys / indices) to a node of a JSON tree, the root excluded."""
    out: List[Tuple[Any, ...]] = []
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else []
    for key, value in items:
        out.append(prefix + (key,))
        out.extend(json_paths(value, prefix + (key,)))
    return out


def mutate_json(tree: Any, path: Sequence[Any], how: str, value: Any) -> None:
    """Change ``tree`` in place at ``path``: ``replace`` the node with ``value``, ``delete`` it, add an ``extra``
    key next to it, ``duplicate`` or ``shuffle`` the list holding it."""
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if how == "replace":
        parent[key] = value
    elif how == "delete":
        del parent[key]
    elif how == "extra" and isinstance(parent, dict):
        parent[f"extra_{len(parent)}"] = value
    elif how == "duplicate" and isinstance(parent, list):
        parent.append(parent[key])
    elif how == "shuffle" and isinstance(parent, list):
        parent.reverse()


def damage_bytes(data: bytes, how: str, position: int, bits: int) -> bytes:
    """``data`` truncated at ``position``, with bit ``bits % 8`` of byte ``position`` flipped, or with junk appended."""
    if not data:
        return data
    position %= len(data)
    if how == "truncate":
        return data[:position]
    if how == "flip":
        return data[:position] + bytes([data[position] ^ (1 << (bits % 8))]) + data[position + 1:]
    return data + bytes([bits % 256]) * (position % 97 + 1)

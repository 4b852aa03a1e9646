"""``torchrec-ascend policies``: list the installed cache policies with the distribution each comes from.

Example::

    $ torchrec-ascend policies
    $ torchrec-ascend policies --kind eviction --json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List

from torchrec_ascend.errors import TorchRecAscendError
from torchrec_ascend.policies.registry import KINDS, PolicyEntry, list_policies

COLUMNS = ("name", "kind", "distribution", "version", "plugin", "description")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``policies`` subcommand."""
    parser = subparsers.add_parser(
        "policies",
        help="list installed eviction and admission policies",
        description="List the eviction and admission policies installed through the torchrec_ascend entry-point "
        "group (built-ins included), with the distribution and version each comes from.",
    )
    parser.add_argument("--kind", choices=KINDS, help="only policies of this kind")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.set_defaults(run=run)


def rows(entries: List[PolicyEntry]) -> List[dict]:
    """One dict per policy with the :data:`COLUMNS`."""
    return [
        {"name": e.name, "kind": e.kind, "distribution": e.distribution, "version": e.version,
         "plugin": e.plugin.name, "description": e.description}
        for e in entries
    ]  # fmt: skip


def format_table(table: List[dict]) -> str:
    """Aligned text table of :func:`rows` output."""
    widths = {c: max([len(c)] + [len(str(r[c])) for r in table]) for c in COLUMNS}
    line = lambda r: "  ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS).rstrip()
    return "\n".join([line({c: c.upper() for c in COLUMNS})] + [line(r) for r in table])


def run(args: argparse.Namespace) -> int:
    """Print the policies; exit status 1 (with the reason on stderr) if a plugin is broken."""
    try:
        table = rows(list_policies(args.kind))
    except TorchRecAscendError as err:
        print(f"torchrec-ascend policies: {err}", file=sys.stderr)
        return 1
    print(json.dumps(table, indent=2) if args.json else format_table(table))
    return 0

"""The ``torchrec-ascend`` command line: one subcommand module each, exposing ``add_parser`` and ``run``.

Example::

    $ torchrec-ascend doctor
    $ torchrec-ascend policies
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

SUBCOMMANDS = ("doctor", "policies", "cache_sim", "conformance")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="torchrec-ascend", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"torchrec_ascend.cli.{name}")
        module.add_parser(subparsers)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())

"""``torchrec-ascend conformance``: check that this install behaves like TorchRec's reference semantics on a device.

Runs the conformance suite (``torchrec_ascend.conformance_tests``, through pytest) on the device: injection state,
every sharding type x kernel x optimizer the device's profile lists against the unsharded reference, hash-table
semantics, KEY_VALUE transparency, the policy contract, pipeline equivalence, checkpoints and the documented
bad-input errors; multi-process checks spawn their own ranks. Prints a summary per check (cases, passed, failed,
skipped with the reason, seconds, where the cases trained) and the host<->device copies and host syncs per
training step of each kernel; the exit status is 0 only when nothing failed (1: a check failed, 2: bad usage, an
absent device or missing test dependencies, 6: nothing was checked). ``--device npu --emulate`` runs the suite on
torchrec_ascend.testing's emulated NPU (no Ascend hardware needed; refused where torch_npu is installed).

Example::

    $ torchrec-ascend conformance --device npu --world-size 8
    $ torchrec-ascend conformance --device npu --emulate
    $ torchrec-ascend conformance --device npu --emulate --emulate-memory 1073741824
    $ torchrec-ascend conformance --quick --junit conformance.xml
    $ torchrec-ascend conformance --only key_value --case ebc-row_wise-adagrad-12-64-8
    $ torchrec-ascend conformance --only policies --policy my_policy --policy 'ttl={"ttl_steps": 3}'
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from typing import List

from torchrec_ascend import conformance_tests
from torchrec_ascend.conformance_tests.config import CHECKS, OPTIONS, SuiteConfig, add_options
from torchrec_ascend.errors import TorchRecAscendError

PACKAGE = conformance_tests.__name__
PACKAGE_DIR = conformance_tests.__path__[0]
PLUGIN = f"{PACKAGE}.pytest_plugin"
USAGE_ERROR = 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``conformance`` subcommand."""
    parser = subparsers.add_parser(
        "conformance",
        help="check this install against TorchRec's reference semantics on a device",
        description=__doc__.split("\n\n")[1].replace("\n", " ").replace("``", ""),
    )
    add_options(parser.add_argument, cli=True)
    parser.add_argument("--only", nargs="+", choices=CHECKS, metavar="CHECK",
                        help=f"run only these checks: {', '.join(CHECKS)}")
    parser.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report (one test case per case)")
    parser.set_defaults(run=run)


def pytest_args(args: argparse.Namespace) -> List[str]:
    """The pytest command line that runs the suite as ``args`` ask.

    Example::

        pytest_args(parser.parse_args(["conformance", "--quick", "--only", "policies"]))
        # ['-p', '...pytest_plugin', '--pyargs', 'torchrec_ascend.conformance_tests.test_policies', ...]
    """
    argv = [] if _plugin_auto_loaded() else ["-p", PLUGIN]
    targets = [f"{PACKAGE}.test_{check}" for check in args.only or []] or [PACKAGE]
    # pytest takes its root from the working directory when given module names: root it at the suite, so test ids
    # read test_<check>.py::... wherever the command runs.
    argv += [f"--rootdir={PACKAGE_DIR}", "--pyargs", *targets]
    # No cache written into the installed package; short tracebacks: the assertion says what differs.
    argv += ["-p", "no:cacheprovider", "--tb=short", "-rfE"]
    for option, (flag, default, _) in OPTIONS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if isinstance(default, bool):
            argv += [option] if value else []
        elif isinstance(default, tuple):
            argv += [f"{option}={v}" for v in value]
        else:
            argv.append(f"{option}={value}")
    if args.junit:
        argv.append(f"--junitxml={args.junit}")
    return argv


def _plugin_auto_loaded() -> bool:
    """Whether a ``pytest11`` entry point already loads the suite's plugin (``-p`` would register it twice)."""
    # Every distribution, as pytest scans them: entry_points() keeps one distribution per name, and a stale
    # egg-info on sys.path (a source checkout) can hide the installed one's entry points.
    return any(
        ep.group == "pytest11" and ep.value == PLUGIN
        for dist in importlib.metadata.distributions()
        for ep in dist.entry_points
    )


def run(args: argparse.Namespace) -> int:
    """Run the suite; return pytest's exit status (0: every case passed or was skipped with a reason)."""
    try:
        suite = SuiteConfig(device=args.device, world_size=args.world_size, policies=tuple(args.policy),
                            quick=args.quick, emulate=args.emulate, emulate_memory=args.emulate_memory,
                            cases=tuple(args.case))
        absent = suite.absent_reason()  # an unknown device stops here, listing the known ones
    except TorchRecAscendError as err:
        print(f"torchrec-ascend conformance: {err}", file=sys.stderr)
        return USAGE_ERROR
    if absent:
        print(f"torchrec-ascend conformance: {absent}", file=sys.stderr)
        return USAGE_ERROR
    try:
        import pytest
    except ImportError:
        print("torchrec-ascend conformance runs on pytest and hypothesis: pip install 'torchrec-ascend[conformance]'",
              file=sys.stderr)
        return USAGE_ERROR
    status = pytest.main(pytest_args(args))
    return USAGE_ERROR if status == pytest.ExitCode.USAGE_ERROR else int(status)

"""``torchrec-ascend cache-sim``: replay an ID trace through the installed eviction policies and Belady's optimum.

Prints, per trace, the hit rate of every policy at every cache size with its ratio to the optimum, and writes a
PNG plot. Semantics are those of the KEY_VALUE cache (see :mod:`torchrec_ascend.policies.simulator`).

Example::

    $ torchrec-ascend cache-sim --trace zipf movielens --cache-fractions 0.05,0.2 --plot sim.png
    $ torchrec-ascend cache-sim --policies lru,ttl+lfu --options '{"ttl+lfu": {"ttl": {"ttl_steps": 50}}}'
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List

from torchrec_ascend.errors import ConfigError, TorchRecAscendError
from torchrec_ascend.policies.registry import find_policy, list_policies, split_policy_name
from torchrec_ascend.policies.simulator import SimReport, plot, prepare, simulate
from torchrec_ascend.policies.traces import TRACES, make_trace


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``cache-sim`` subcommand."""
    parser = subparsers.add_parser(
        "cache-sim",
        help="compare eviction policies' hit rates against Belady's optimum on ID traces",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--trace", nargs="+", choices=sorted(TRACES), default=["zipf"], help="traces to replay")
    parser.add_argument("--accesses", type=int, default=1_000_000, help="synthetic trace length")
    parser.add_argument("--keys", type=int, default=100_000, help="synthetic catalogue size")
    parser.add_argument("--alpha", type=float, default=1.0, help="Zipf skew of synthetic traces")
    parser.add_argument("--phases", type=int, default=10, help="popularity shifts of the drift trace")
    parser.add_argument("--seed", type=int, default=0, help="trace seed")
    parser.add_argument("--batch-size", type=int, default=1024, help="accesses per batch")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--cache-sizes", help="comma-separated cache sizes in slots")
    sizes.add_argument(
        "--cache-fractions", default="0.05,0.1,0.3", help="comma-separated cache sizes, fractions of the distinct keys"
    )
    parser.add_argument("--policies", help="comma-separated eviction policies (default: every installed one)")
    parser.add_argument(
        "--options", default="{}", help='JSON object: policy name -> its options, e.g. \'{"ttl": {"ttl_steps": 50}}\''
    )
    parser.add_argument("--interval", type=int, default=1, help="eviction cadence interval in steps")
    parser.add_argument("--min-residency", type=int, default=0, help="steps a new slot is protected from eviction")
    parser.add_argument("--headroom", type=float, default=0.0, help="fraction left free by cadence evictions")
    parser.add_argument("--plot", default="cache_sim.png", help="PNG to write ('' for none)")
    parser.set_defaults(run=run)


def _trace_options(args: argparse.Namespace, name: str) -> Dict[str, Any]:
    if name == "movielens":
        return {"seed": args.seed}
    options = {"num_accesses": args.accesses, "num_keys": args.keys, "alpha": args.alpha, "seed": args.seed}
    return {**options, "phases": args.phases} if name == "drift" else options


def _capacities(args: argparse.Namespace, num_keys: int) -> List[int]:
    try:
        if args.cache_sizes:
            return [int(v) for v in args.cache_sizes.split(",")]
        return [max(1, round(float(v) * num_keys)) for v in args.cache_fractions.split(",")]
    except ValueError as err:
        raise ConfigError(f"cache sizes must be comma-separated numbers: {err}") from err


def _policies(args: argparse.Namespace) -> Dict[str, Dict[str, Any]]:
    try:
        options = json.loads(args.options)
    except json.JSONDecodeError as err:
        example = '{"ttl": {"ttl_steps": 50}}'
        raise ConfigError(f"--options is not valid JSON ({err}); pass an object such as '{example}'") from None
    if not isinstance(options, dict):
        raise ConfigError("--options must be a JSON object mapping policy names to option objects")
    names = args.policies.split(",") if args.policies else [e.name for e in list_policies("eviction")]
    for name in names:  # unknown names fail now, not after a trace was built
        for part in split_policy_name(name):
            find_policy(part, "eviction")
    stray = sorted(set(options) - set(names))
    if stray:
        raise ConfigError(f"--options names policies that are not simulated: {stray}; simulated: {names}")
    return {name: options.get(name, {}) for name in names}


def simulate_trace(args: argparse.Namespace, name: str, policies: Dict[str, Dict[str, Any]]) -> SimReport:
    """Build trace ``name`` from the arguments and simulate it (cache sizes below the largest batch are dropped)."""
    trace = make_trace(name, **_trace_options(args, name))
    batches = prepare(trace, args.batch_size)
    capacities = _capacities(args, batches.num_keys)
    fitting = [c for c in capacities if c >= batches.max_batch_keys]
    dropped = sorted(set(capacities) - set(fitting))
    if not fitting:
        raise ConfigError(
            f"trace {name}: every cache size {capacities} is below the {batches.max_batch_keys} distinct keys of the "
            f"largest batch; use larger caches or a smaller --batch-size"
        )
    cadence = {"interval": args.interval, "min_residency": args.min_residency, "headroom": args.headroom}
    report = simulate(trace, args.batch_size, fitting, policies, label=name, cadence_options=cadence)
    report.notes += [f"cache size {c} dropped: below the {batches.max_batch_keys} keys of the largest batch"
                     for c in dropped]  # fmt: skip
    return report


def run(args: argparse.Namespace) -> int:
    """Simulate every requested trace, print the tables, write the plot; exit status 1 on a bad option."""
    try:
        policies = _policies(args)
        reports = [simulate_trace(args, name, policies) for name in args.trace]
    except TorchRecAscendError as err:
        print(f"torchrec-ascend cache-sim: {err}", file=sys.stderr)
        return 1
    for report in reports:
        print(report.table(), end="\n\n")
    if args.plot:
        plot(reports, args.plot)
        print(f"plot written to {args.plot}")
    return 0

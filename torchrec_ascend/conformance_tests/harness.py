"""What every check module shares: parametrize by the derived cases, launch the script once, fetch a case's result.

A check module derives its cases from the suite settings (``cases.py``), parametrizes its test with them
(:func:`parametrize` from ``pytest_generate_tests``), launches its script once in a module-scoped fixture
(:func:`launch`) and reads each case's result in the test (:func:`result_of`); :func:`script_check` makes the hook
and the fixture. Skipped cases never launch anything.

A case that trains must report where its tensors lived (``residency``, see ``plugin/runner.py``): :func:`result_of`
fails it when any part lived off the suite's device, and attaches the residency and the per-kernel copy and sync
counts to the test's report for the summary table.

Example::

    pytest_generate_tests, run = script_check(SCRIPT, cases_of)

    def test_case(case, request):
        result = result_of(request, "run", case)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from torchrec_ascend.conformance_tests.cases import Case
from torchrec_ascend.conformance_tests.config import ScriptRun, SuiteConfig


def parametrize(metafunc: Any, derive: Callable[[SuiteConfig], List[Case]], name: str = "case") -> None:
    """Parametrize the test's ``name`` argument with the check's cases, ids from :attr:`Case.id`."""
    if name in metafunc.fixturenames:
        cases = derive(SuiteConfig.from_pytest(metafunc.config))
        metafunc.parametrize(name, cases, ids=[c.id for c in cases])


#: Parts a training case must report tensors for (``optimizer`` may be empty: SGD holds no state).
REQUIRED_PARTS = ("parameters", "outputs")
#: Per training call of each per-batch part, the most host<->device copies and host syncs allowed, as (fixed, per
#: table the call serves): the budgets the kernels' docstrings state (``torchrec_ascend/kernels/fused.py``,
#: ``sharders/hash_row_wise.py``, ``sharders/index_dedup.py``). A blocking device-to-host copy is a host sync.
#:
#: * FUSED hash: the IDs down, the rows up, each table's new rows' slots and values up. KEY_VALUE: also each
#:   table's evicted rows' slots up and the rows down (``pack_rows`` gathers them on the device).
#: * ``_vbe``: the same kernel on a variable-batch KJT, where stock fbgemm's ``generate_vbe_metadata`` adds 3 up
#:   and placing the output into TorchRec's shared one (``place_vbe_output``, for TBEs that cannot write it: the
#:   CPU's, the emulator's) adds 1 up.
#: * Row-wise input dist: lengths, IDs and weights down in one copy and the bucketed ones up in one, plus what
#:   TorchRec's all-to-all inside it moves: ``length_per_key`` down, its split tensors up (one per input tensor
#:   plus the stride, or with VBE the per-rank strides).
#: * Dedup: the IDs down; distinct IDs, lengths, reverse indices and weights up.
#: * ``key_value_pipeline_compute_thread``: not a part but a training step of KEY_VALUE tables behind
#:   ``HybridTrainPipelineSparseDist`` once it is full, counted on the caller's (compute) thread only: ID mapping,
#:   swap planning and swap-in run on the pipeline's lanes, so compute pays at most 2 up, 1 down and no host sync.
#:   ``fused_hash_pipeline_compute_thread``: the same for FUSED hash tables (their IDs are mapped on the lanes too):
#:   at most 1 up, nothing down, no host sync.
TRANSFER_BUDGET = {
    "fused_hash": {"d2h": (1, 0), "syncs": (1, 0), "h2d": (1, 2)},
    "fused_hash_vbe": {"d2h": (1, 0), "syncs": (1, 0), "h2d": (5, 2)},
    "key_value": {"d2h": (1, 1), "syncs": (1, 1), "h2d": (1, 3)},
    "key_value_vbe": {"d2h": (1, 1), "syncs": (1, 1), "h2d": (5, 3)},
    "row_wise_input_dist": {"d2h": (2, 0), "syncs": (2, 0), "h2d": (5, 0)},
    "row_wise_input_dist_vbe": {"d2h": (2, 0), "syncs": (2, 0), "h2d": (6, 0)},
    "index_dedup": {"d2h": (1, 0), "syncs": (1, 0), "h2d": (4, 0)},
    "key_value_pipeline_compute_thread": {"d2h": (1, 0), "syncs": (0, 0), "h2d": (2, 0)},
    "fused_hash_pipeline_compute_thread": {"d2h": (0, 0), "syncs": (0, 0), "h2d": (1, 0)},
}


def script_check(
    script: Path, cases_of: Callable[[SuiteConfig], List[Case]], world_size: Optional[int] = None,
    fixture: str = "run",
) -> Tuple[Callable[[Any], None], Any]:
    """A check module's ``pytest_generate_tests`` (the ``case`` argument takes ``cases_of``'s cases) and its
    module-scoped fixture ``fixture``, which launches ``script`` once for them (see :func:`launch`)."""

    def pytest_generate_tests(metafunc: Any) -> None:
        parametrize(metafunc, cases_of)

    @pytest.fixture(scope="module", name=fixture)
    def run(suite: SuiteConfig) -> ScriptRun:
        return launch(suite, script, cases_of(suite), world_size)

    return pytest_generate_tests, run


def launch(suite: SuiteConfig, script: Path, cases: List[Case], world_size: Optional[int] = None,
           timeout: float = 600.0) -> ScriptRun:
    """Run ``script`` for the runnable ``cases`` on the suite's device; skip when the device is not here.

    Raises:
        LaunchError: see :meth:`SuiteConfig.run_script`.
    """
    reason = suite.absent_reason()
    if reason:
        pytest.skip(reason)
    return suite.run_script(script, cases, world_size, timeout)


def result_of(request: Any, fixture: str, case: Case, trains: bool = True) -> Dict[str, Any]:
    """The result of ``case`` from the module's launch fixture, failing with the script's traceback on an error.

    Skips a case that carries a skip reason before the fixture (and its launch) is requested.

    Args:
        trains: the case trains a model, so it must report ``residency`` on the suite's device
            (see :func:`check_residency`).
    """
    if case.skip:
        pytest.skip(case.skip)
    run: ScriptRun = request.getfixturevalue(fixture)
    result = run.results[case.id]
    assert not result.get("error"), result.get("traceback") or result["error"]
    if result.get("transfers"):
        request.node.user_properties.append(("transfers", result["transfers"]))
        check_transfers(result["transfers"])
    if trains:
        suite: SuiteConfig = request.getfixturevalue("suite")
        check_residency(result.get("residency"), suite.device)
        request.node.user_properties.append(("residency", result["residency"]))
    return result


def check_transfers(transfers: Dict[str, Dict[str, int]]) -> None:
    """Fail when a per-batch part copied or synced more than :data:`TRANSFER_BUDGET` allows over its calls.

    Raises:
        AssertionError: naming the part, what it spent per call and its budget.

    Example::

        check_transfers({"fused_hash": {"steps": 8, "h2d": 16, "d2h": 8, "syncs": 8, "tables": 1}})
    """
    over = []
    for kernel, counts in transfers.items():
        for key, (fixed, per_table) in TRANSFER_BUDGET.get(kernel, {}).items():
            allowed = counts["steps"] * (fixed + per_table * counts.get("tables", 1))
            if counts[key] > allowed:
                over.append(f"{kernel}: {counts[key] / counts['steps']:.2f} {key} per call, budget "
                            f"{allowed / counts['steps']:.0f}")
    assert not over, "host<->device traffic over budget: " + "; ".join(over)


def check_residency(where: Optional[Dict[str, List[str]]], device: str) -> None:
    """Fail unless every part of ``where`` (part -> device types, from a script's ``residency``) lived on ``device``.

    Raises:
        AssertionError: no residency reported, a required part (:data:`REQUIRED_PARTS`) held no tensor, or a part
            held tensors on another device type; the message names the parts and where they were.

    Example::

        check_residency({"parameters": ["npu"], "optimizer": [], "inputs": ["npu"], "outputs": ["npu"]}, "npu")
    """
    assert where, f"the case reported no residency: nothing shows it trained on {device}"
    empty = [part for part in REQUIRED_PARTS if not where.get(part)]
    assert not empty, f"the case reported no tensors for {', '.join(empty)}: nothing shows they were on {device}"
    off = {part: types for part, types in where.items() if set(types) - {device}}
    assert not off, (
        f"asked for {device}, the case trained on other tensors: "
        + "; ".join(f"{part} on {', '.join(types)}" for part, types in off.items())
    )

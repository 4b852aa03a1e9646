"""The conformance suite fails when a kernel or a policy is broken, and passes when nothing is.

Broken kernels: ``conformance_faults.py`` is installed as a throwaway plugin distribution (on ``PYTHONPATH``, for
one ``torchrec-ascend conformance --quick --only CHECK`` run in a subprocess) and breaks stock fbgemm (row-wise
bucketization, one fused optimizer update) or torchrec-ascend's own parts (the hash bucketizer, the slot table's
eviction, the KEY_VALUE swap of optimizer state, the Saver, the dedup reverse index, a reused row's optimizer state
in FUSED and KEY_VALUE, the pins of the batch in compute, the IDs an incremental save removes, KEY_VALUE tables and
their policy state in stock ``state_dict()``, a FUSED hash table's prefetch, the size of a ``load_factor=1.0``
cache, the eviction cadence's protection of young rows and its interval, the refusal of a sharding type hash tables
do not support, the policy step of a batch, the reserved row rejected IDs read, new rows' initialisation by ID, the
documented bad-input errors: a full table, a negative ID, a batch larger than the KEY_VALUE cache, a policy name
without its suggestion, a checkpoint file name leaving its folder, a disk-tier record's checksum; each again on the
emulated NPU, run on the cases it must fail alone with ``--case``), more whose cases run in full runs only (a Saver
load refused on one rank alone, a KEY_VALUE load holding an ID twice, ADAM's betas unchecked, the planner's estimate
of a KEY_VALUE cache, a FUSED hash table's ``weight_id`` not restored, the not-admitted row in the optimizer state,
``dense_state_dict`` leaving out plain tables, and the injection hooks stock modules run through: ``DMP.copy()``'s
shared process groups, the backward of uneven per-rank batches, the prefetch step of stock
``PrefetchTrainPipelineSparseDist`` without streams (CPU), the streams of stock pipelines (emulated NPU); CPU and
emulated NPU, ``--case``), and on the emulated NPU
only a dropped host-to-device copy and the stream-order check's faults: a missing stage wait, a missing
``record_stream``, a host read of an in-flight copy. Faults run in groups (``fault_rounds``): in one run of a check each
fault is scoped to the cases it must fail (``FAULT@TEST``) and no case is another fault's, so each case fails with
its own fault's words while every other case passes: a run per fault would start the suite, torchrun and torchrec
each time. The same checks without a fault are the control: they must pass, so the failures come from the faults.
Broken policy: ``broken_policy_plugin.py`` is registered in-process and checked with ``--policy`` next to a healthy
one. Oracle: exit status and the JUnit report, case by case.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set, Tuple

import pytest

import broken_policy_plugin
from torchrec_ascend.cli import main as cli_main
from torchrec_ascend.plugin_manager import get_plugin_manager

pytestmark = pytest.mark.multiprocess

HERE = Path(__file__).parent
QUICK_SHARDING = ["conformance", "--quick", "--only", "sharding"]
ROW_WISE, COLUMN_WISE = "test_case[ebc-row_wise-rowwise_adagrad]", "test_case[ec-column_wise-adagrad]"
ENTRY_POINT = "test_entry_point_activated_the_plugin"


def junit_outcomes(path: Path, check: str = "") -> Dict[str, str]:
    """Test name -> ``passed``/``failed``/``skipped`` from a JUnit report (only ``check``'s tests, if given)."""
    outcomes = {}
    for case in ET.parse(path).iter("testcase"):
        if check and case.get("classname") != f"test_{check}":
            continue
        kinds = {child.tag for child in case}
        outcomes[case.get("name")] = (
            "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        )
    return outcomes


def junit_failures(path: Path) -> Dict[str, str]:
    """Test name -> what its failure or error says (message and traceback), for the tests that failed."""
    return {case.get("name"): "\n".join(f"{child.get('message', '')}\n{child.text or ''}" for child in case
                                         if child.tag in ("failure", "error"))
            for case in ET.parse(path).iter("testcase") if any(c.tag in ("failure", "error") for c in case)}


@pytest.fixture(scope="module")
def fault_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the fault plugin as an installed distribution (entry point group ``torchrec_ascend``)."""
    site = tmp_path_factory.mktemp("fault_site")
    shutil.copy(HERE / "conformance_faults.py", site)
    info = site / "conformance_faults-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: conformance-faults\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torchrec_ascend]\nconformance_faults = conformance_faults\n")
    return site


def run_cli(args: List[str], tmp_path: Path, env: Dict[str, str]) -> Tuple[int, str, Dict[str, str]]:
    """Run ``torchrec-ascend <args> --junit ...`` in a subprocess; return its status, output and JUnit outcomes."""
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "torchrec_ascend.cli", *args, "--junit", str(junit)],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    output = proc.stdout + proc.stderr
    assert junit.exists(), f"no JUnit report written:\n{output}"
    return proc.returncode, output, junit_outcomes(junit)


#: fault -> (check run quick, the cases it must fail, a phrase of the failure, or phrases one of which must show).
#: Every other case must pass.
REUSED_ROW = "test_case[reused_row-ebc-row_wise-{}-rowwise_adagrad]"
CADENCE = "test_case[cadence-ebc-table_wise-{}]"
ADMISSION = "test_case[admission-ebc-table_wise-{}]"
PINNED = "test_case[pipeline-row_wise-rowwise_adagrad-40-2-20-8]"  # also bit for bit against FUSED
#: KEY_VALUE behind the pipeline on 2 ranks, bit for bit against FUSED; on the emulated NPU its compute thread is
#: held to a copy and sync budget.
COMPUTE_BUDGET_CASE = "test_case[pipeline-row_wise-rowwise_adagrad-32-3-96-8-compute_thread]"
#: The same with FUSED hash tables behind the pipeline: every batch's IDs mapped on a lane.
FUSED_BUDGET_CASE = "test_case[pipeline-row_wise-rowwise_adagrad-32-3-compute_thread-fused]"
#: The quick DCP cases: a KEY_VALUE model restored with an empty cache trains on exactly as the saved one.
DCP_SAME = "test_case[dcp-ebc-row_wise-key_value-rowwise_adagrad-default-row_wise-key_value-2-loaded]"
DCP_CASES = {DCP_SAME, "test_case[dcp-ec-row_wise-key_value-adagrad-default-table_wise-key_value-1-loaded]"}
OWN_FAULTS: Dict[str, Tuple[str, Set[str], Any]] = {
    "hash_bucketizer": ("hash_tables", {"test_case[ebc-row_wise-rowwise_adagrad]",
                                        "test_case[ec-row_wise-rowwise_adagrad-index_dedup]",
                                        REUSED_ROW.format("fused"), REUSED_ROW.format("key_value")}, "oracle"),
    "dedup_reverse": ("hash_tables", {"test_case[ec-row_wise-rowwise_adagrad-index_dedup]"}, "oracle"),
    "eviction_ids": ("key_value", {"test_case[ebc-row_wise-adagrad-12-64-8]", PINNED, COMPUTE_BUDGET_CASE},
                     "not bit for bit"),
    "kv_optimizer_state": ("key_value", {"test_case[ebc-row_wise-adagrad-12-64-8]", PINNED, COMPUTE_BUDGET_CASE},
                           "not bit for bit"),
    "saver_row": ("checkpoint", {
        "test_case[round_trip-ebc-row_wise-fused-rowwise_adagrad-evict-row_wise-fused-2]",
        "test_case[round_trip-ebc-column_wise-fused-adagrad-default-table_wise-key_value-1]",
        "test_case[gone_ids-ebc-row_wise-fused-1]"}, ("rows right after loading differ", "do not restore")),
    # Issue 31's promises: a reused row's fresh optimizer state, pins released after backward, no resurrection.
    "fresh_state_fused": ("hash_tables", {REUSED_ROW.format("fused")}, "does not train as a new row"),
    # (the admission case's rows come back from host memory too)
    "fresh_state_key_value": ("hash_tables", {REUSED_ROW.format("key_value"), ADMISSION.format("key_value")},
                              ("does not train as a new row", "admission oracle")),
    "pins_kept": ("key_value", {PINNED, COMPUTE_BUDGET_CASE}, "CapacityError"),
    # Resurrected IDs overflow the restored shard (the load refuses) or, where they fit, are counted.
    "saver_removed": ("checkpoint", {"test_case[gone_ids-ebc-row_wise-fused-1]"},
                      ("IDs to restore into a shard", "came back")),
    # Issue 26: KEY_VALUE tables in stock state_dict() (DCP).
    "kv_state_dict_placeholder": ("checkpoint", DCP_CASES, "'user'"),
    # ... and its policy state: a model restored by DCP alone makes the saved model's cache and policy decisions.
    "policy_state_dropped": ("checkpoint", {DCP_SAME}, "hash-table counters differ"),
    # A cache of load_factor=1.0 holds the whole shard; hash tables refuse a sharding type they do not support.
    "whole_shard_short": ("key_value", {"test_case[ebc-row_wise-rowwise_adagrad-12-512-8]"},
                          "a cache of the whole shard evicted"),
    # Issue 27: FUSED hash tables prefetch behind a prefetching pipeline (their IDs mapped on a lane).
    # (on the emulated NPU the mapping left on the compute thread breaks its copy budget first)
    "fused_not_prefetched": ("key_value", {FUSED_BUDGET_CASE},
                             ("were prefetched", "fused_hash_pipeline_compute_thread: 2.00 d2h per call, budget 0")),
    # (the cadence's bulk steps come twice as often too)
    "double_policy_step": ("hash_tables", {"test_case[policy_steps-ebc-unsharded-fused]",
                                           "test_case[policy_steps-ebc-row_wise-fused]",
                                           CADENCE.format("fused"), CADENCE.format("key_value")},
                           ("one step per batch", "the rules ask for")),
    # eviction_cadence: min_residency and interval
    "young_not_protected": ("hash_tables", {CADENCE.format("fused"), CADENCE.format("key_value")},
                            "while mature ones"),
    "cadence_every_step": ("hash_tables", {CADENCE.format("fused"), CADENCE.format("key_value")},
                           "the rules ask for"),
    # Admission: rejected IDs read not_admitted_value (the reserved row, rewritten before every lookup).
    "not_admitted_row_trained": ("hash_tables", {ADMISSION.format("fused"), ADMISSION.format("key_value")},
                                 "differ from the admission oracle"),
    "hash_sharding_unchecked": ("errors", {"test_case[unsupported_sharding-table_row_wise-by_hand]",
                                           "test_catalogue[constraints-hash_table_row_wise_sharding]"},
                                ("expected a ConfigError, got no error", "raised no RuntimeError")),
    # New rows are a function of (init_seed, ID, column): not of the slot an ID lands in.
    "init_from_slot": ("hash_tables", {"test_case[ebc-row_wise-rowwise_adagrad]",
                                       "test_case[ec-row_wise-rowwise_adagrad-index_dedup]",
                                       REUSED_ROW.format("fused"), ADMISSION.format("fused")},
                       ("forward output differs from the unsharded oracle", "does not train as a new row",
                        "admission oracle")),
    # The documented bad-input errors: a full table, a negative ID, a batch larger than the KEY_VALUE cache, an
    # unknown policy name or option, a checkpoint naming a file outside its folder, a damaged disk-tier record.
    "full_table_silent": ("errors", {"test_case[full_table-table_wise]"}, "expected a CapacityError, got no error"),
    "negative_id_unchecked": ("errors", {"test_case[negative_id-table_wise]"}, "the ValueError does not name"),
    "small_cache_silent": ("errors", {"test_catalogue[batches-cache_too_small]"}, "raised no CapacityError"),
    "policy_no_suggestion": ("errors", {"test_unknown_policy_suggests_the_closest",
                                        "test_unknown_policy_option_suggests_the_closest",
                                        "test_catalogue[policies-unknown_policy]"},
                             ("does not say \"did you mean 'lru'\"", "did you mean")),
    "path_escape_accepted": ("errors", {"test_catalogue[checkpoints-path_escape]"},
                             "does not say 'which is not a plain file name of the folder'"),
    "disk_checksum_partial": ("errors", {"test_catalogue[disks-flipped_segment_byte]"}, "raised no StorageError"),
    # An unknown backend name is refused with the valid names and the closest one.
    "backend_no_suggestion": ("errors", {"test_unknown_backend_lists_the_names"}, "Did you mean"),
    # Every patch applies (the injection check's doctor probe runs in the first test's setup).
    "patch_fails": ("injection", {"test_doctor_finds_no_problem", "test_every_patch_applied"}, "is gone"),
    # cache_metrics counts the swaps.
    "swaps_uncounted": ("key_value", {"test_case[ebc-row_wise-adagrad-12-64-8]"}, "the cache never swapped"),
    # Composed eviction policies keep every component's state.
    "composite_state_partial": ("policies", {"test_contract[ttl+lfu-eviction]"}, "state_dict"),
    # HybridTrainPipelineSparseDist trains every batch, as a plain loop does.
    "last_batches_dropped": ("pipeline", {"test_case[equivalence-both-row_wise-3-8]"}, "batches trained, expected"),
}


@pytest.fixture(scope="module")
def controls(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Dict[str, str]]:
    """The quick checks the faults break, run once (one run) without a fault: check -> its JUnit outcomes (all
    must pass)."""
    checks = sorted({check for check, _, _ in OWN_FAULTS.values()})
    folder = tmp_path_factory.mktemp("controls")
    status, output, outcomes = run_cli(["conformance", "--quick", "--only", *checks], folder, {})
    assert status == 0 and set(outcomes.values()) == {"passed"}, output
    out = {check: junit_outcomes(folder / "junit.xml", check) for check in checks}
    assert all(out.values()), f"a check ran no case: {out}"
    return out


#: Faults that replace a value, not a function: they cannot be scoped to cases and run alone (see
#: ``conformance_faults.py``).
UNSCOPED = {"hash_sharding_unchecked"}
#: Faults that run alone: the unscoped ones, and those that stop a script's ranks (the emulated NPU's stream-order
#: check), after which every case of the script reports the script's first error, another fault's in a group.
RUN_ALONE = UNSCOPED | {"first_prefetch_unordered"}
Faults = Dict[str, Tuple[str, Set[str], Any]]


def runnable(cases: Set[str], parametrized_only: bool) -> Set[str]:
    """The cases a run reaches: with ``parametrized_only`` (runs with ``--case``), the parametrized ones alone."""
    return {case for case in cases if "[" in case or not parametrized_only}


def fault_rounds(faults: Faults, parametrized_only: bool = False) -> List[Tuple[str, Tuple[str, ...]]]:
    """The faults grouped into runs, per check: in a run each fault is scoped to the cases it must fail, and no case
    is any other fault's, so each case fails for its own fault alone and one run shows several faults biting.
    (``parametrized_only``: runs with ``--case``, which reach only parametrized tests.) -> (check, faults) per run.
    """
    rounds: List[Tuple[str, List[str], Set[str]]] = []
    for fault in sorted(faults):
        check, failing, _ = faults[fault]
        failing = runnable(failing, parametrized_only)
        if not failing:
            continue
        room = next((r for r in rounds if r[0] == check and not r[2] & failing and fault not in RUN_ALONE
                     and not set(r[1]) & RUN_ALONE), None)
        if room is None:
            rounds.append((check, [fault], set(failing)))
        else:
            room[1].append(fault)
            room[2].update(failing)
    return [(check, tuple(names)) for check, names, _ in rounds]


def round_id(round_: Tuple[str, Tuple[str, ...]]) -> str:
    return f"{round_[0]}:{'+'.join(round_[1])}"


def scoped(faults: Faults, names: Tuple[str, ...], parametrized_only: bool = False) -> Tuple[Dict[str, str],
                                                                                               Set[str]]:
    """The environment of a run carrying ``names``, each scoped to its failing cases (``UNSCOPED`` ones everywhere),
    and the cases that must fail."""
    entries, failing = [], set()
    for fault in names:
        cases = runnable(faults[fault][1], parametrized_only)
        failing |= cases
        entries += [fault] if fault in UNSCOPED else [f"{fault}@{case}" for case in sorted(cases)]
    env = {"TORCHREC_ASCEND_TEST_FAULT": ",".join(entries), "TORCHREC_ASCEND_COLLECTIVE_TIMEOUT_S": "20"}
    return env, failing


def assert_each_fault_bites(faults: Faults, names: Tuple[str, ...], junit: Path, output: str,
                            parametrized_only: bool = False) -> None:
    """Every case of every fault of the run failed, saying (one of) its fault's phrase(s)."""
    said = junit_failures(junit)
    for fault in names:
        check, failing, phrase = faults[fault]
        phrases = (phrase,) if isinstance(phrase, str) else phrase
        for case in sorted(runnable(failing, parametrized_only)):
            assert any(p in said.get(case, "") for p in phrases), \
                f"{fault}: {case} did not fail saying {phrases}:\n{said.get(case, 'it passed')}\n{output}"
        assert f"test_{check}.py" in output, output


QUICK_ROUNDS = fault_rounds(OWN_FAULTS)


@pytest.mark.teeth
@pytest.mark.parametrize("round_", QUICK_ROUNDS, ids=[round_id(r) for r in QUICK_ROUNDS])
def test_a_broken_part_of_ours_fails_its_check(round_: Tuple[str, Tuple[str, ...]],
                                                controls: Dict[str, Dict[str, str]], fault_site: Path,
                                                tmp_path: Path) -> None:
    """Each fault of the round scoped to its cases in one quick run of the check: exactly those cases fail, each
    saying its fault's phrase; every other case passes."""
    check, names = round_
    env, failing = scoped(OWN_FAULTS, names)
    status, output, outcomes = run_cli(["conformance", "--quick", "--only", check], tmp_path,
                                       {"PYTHONPATH": str(fault_site), **env})
    assert status == 1, output
    assert outcomes == {case: "failed" if case in failing else "passed" for case in controls[check]}, output
    assert_each_fault_bites(OWN_FAULTS, names, tmp_path / "junit.xml", output)


def test_passes_without_a_fault(tmp_path: Path) -> None:
    status, output, outcomes = run_cli(QUICK_SHARDING, tmp_path, {})
    assert status == 0, output
    assert outcomes == {ENTRY_POINT: "passed", ROW_WISE: "passed", COLUMN_WISE: "passed"}, output
    assert "conformance summary" in output and "sharding" in output


@pytest.mark.teeth
def test_off_by_one_bucketization_fails_row_wise(fault_site: Path, tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(fault_site), "TORCHREC_ASCEND_TEST_FAULT": "bucketize_off_by_one"}
    status, output, outcomes = run_cli(QUICK_SHARDING, tmp_path, env)
    assert status == 1, output
    # Only the row-wise case bucketizes: the suite pins the fault there.
    assert outcomes == {ENTRY_POINT: "passed", ROW_WISE: "failed", COLUMN_WISE: "passed"}, output


@pytest.mark.teeth
def test_dropped_optimizer_update_fails_every_fused_case(fault_site: Path, tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(fault_site), "TORCHREC_ASCEND_TEST_FAULT": "drop_update"}
    status, output, outcomes = run_cli(QUICK_SHARDING, tmp_path, env)
    assert status == 1, output
    assert outcomes == {ENTRY_POINT: "passed", ROW_WISE: "failed", COLUMN_WISE: "failed"}, output
    assert "differs from the unsharded reference" in output


@pytest.fixture
def broken_policy() -> Iterator[str]:
    """The broken policy plugin, registered on the process-wide plugin manager for one test."""
    manager = get_plugin_manager()
    manager.register(broken_policy_plugin, "conformance_broken_policy")
    try:
        yield broken_policy_plugin.NAME
    finally:
        manager.unregister("conformance_broken_policy")


@pytest.mark.teeth
def test_broken_policy_fails_the_run(broken_policy: str, tmp_path: Path, capsys: Any) -> None:
    junit = tmp_path / "junit.xml"
    status = cli_main(["conformance", "--only", "policies", "--quick", "--policy", broken_policy, "--policy", "lru",
                       "--junit", str(junit)])
    output = capsys.readouterr().out
    assert status == 1, output
    assert junit_outcomes(junit) == {f"test_contract[{broken_policy}]": "failed", "test_contract[lru]": "passed"}
    assert "distinct" in output or "duplicate" in output, "the failure should say how the contract was broken"


def test_a_run_that_checked_nothing_fails(tmp_path: Path) -> None:
    """Through pytest (the CLI refuses an absent device up front): every case skips, the run exits non-zero."""
    from torchrec_ascend import backends
    from torchrec_ascend.cli import conformance as cli
    from torchrec_ascend.conformance_tests.pytest_plugin import NOTHING_CHECKED

    if backends.profile_for("npu").detect():
        pytest.skip("an npu is present here")
    junit = tmp_path / "junit.xml"
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["conformance", "--device", "npu", "--quick", "--only", "sharding", "--junit", str(junit)])
    proc = subprocess.run([sys.executable, "-m", "pytest", *cli.pytest_args(args)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == NOTHING_CHECKED, output
    assert set(junit_outcomes(junit).values()) == {"skipped"}
    assert "no npu device here" in output and "every case skipped: nothing was checked" in output, output


def emulated_npu_absent() -> str:
    """Why the npu backend cannot run on the emulated NPU here (``""`` when it can): the doctor probe, run as the
    suite runs its scripts under ``--emulate``, must select the npu backend."""
    from torchrec_ascend.backends import DEVICE_ENV
    from torchrec_ascend.conformance_tests import launch

    probe = Path(launch.__file__).parent / "injection" / "doctor_state.py"
    env = {**os.environ, DEVICE_ENV: "npu", **launch.script_env("npu", "hccl", emulate=True)}
    proc = subprocess.run(launch.python_command(probe, env), env=env, capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return "the npu backend does not activate on the emulated NPU: " + (proc.stderr.strip().splitlines()
                                                                           or ["no output"])[-1]
    return ""


@pytest.fixture(scope="module")
def emulated_npu() -> None:
    reason = emulated_npu_absent()
    if reason:
        pytest.skip(reason)


#: The emulated NPU's runs here are quick and of a few checks; the whole suite runs on it in CI from the tr18 wheel
#: (scripts/check-wheel, CHECK_WHEEL_FULL_EMULATED).
EMULATED = ["conformance", "--device", "npu", "--emulate"]


def run_round_on_its_cases(faults: Faults, round_: Tuple[str, Tuple[str, ...]], argv: List[str], fault_site: Path,
                           tmp_path: Path) -> None:
    """The round's faults, each scoped to its cases, on those cases alone (``--case``): every one fails, saying its
    fault's phrase. (``--case`` picks parametrized cases: a test of no parameter is left to the CPU's quick run.)"""
    check, names = round_
    env, failing = scoped(faults, names, parametrized_only=True)
    cases = [f"--case={name[name.index('[') + 1:-1]}" for name in sorted(failing)]
    status, output, outcomes = run_cli(argv + ["--only", check, *cases], tmp_path,
                                       {"PYTHONPATH": str(fault_site), **env})
    assert status == 1, output
    assert outcomes == dict.fromkeys(failing, "failed"), output
    assert_each_fault_bites(faults, names, tmp_path / "junit.xml", output, parametrized_only=True)


EMULATED_QUICK_ROUNDS = fault_rounds(OWN_FAULTS, parametrized_only=True)


@pytest.mark.teeth
@pytest.mark.parametrize("round_", EMULATED_QUICK_ROUNDS, ids=[round_id(r) for r in EMULATED_QUICK_ROUNDS])
def test_a_broken_part_of_ours_fails_its_cases_on_the_emulated_npu(round_: Tuple[str, Tuple[str, ...]],
                                                                   emulated_npu: None, fault_site: Path,
                                                                   tmp_path: Path) -> None:
    """Each fault above on the emulated NPU, on the cases it must fail."""
    run_round_on_its_cases(OWN_FAULTS, round_, EMULATED + ["--quick"], fault_site, tmp_path)


REFUSED = "test_case[{}-ebc-row_wise-key_value-{}-default-row_wise-key_value-2-{}]"
INTO_FRESH = REFUSED.format("round_trip", "adagrad", "flipped_byte-fresh_model")
#: Faults whose cases run in full runs only (``--case`` picks them): fault -> (check, the cases it must fail, a phrase).
FULL_RUN_FAULTS: Faults = {
    # A Saver load refused on one rank is refused on every rank, the model unchanged (a load is all or nothing).
    "load_not_agreed": ("checkpoint", {REFUSED.format("round_trip", "adagrad", "flipped_byte"),
                                       REFUSED.format("round_trip", "adagrad", "host_memory"),
                                       INTO_FRESH}, "ranks (a load is all"),
    # ... also when the model had not trained: a rank that stored the rows as it read them empties its tiers again.
    "restores_not_undone": ("checkpoint", {INTO_FRESH}, "had not trained (its KEY_VALUE tiers empty)"),
    # A KEY_VALUE load holding an ID twice is refused naming the table, the model unchanged.
    "ids_twice_accepted": ("checkpoint", {REFUSED.format("dcp", "rowwise_adagrad", "refused-id_twice")},
                           "must be refused saying"),
    # ADAM: a reused row starts Adam from zero; its step count and moments go through the Saver and DCP.
    "fresh_state_fused": ("hash_tables", {"test_case[reused_row-ebc-row_wise-fused-adam]"},
                          "does not train as a new row"),
    "fresh_state_key_value": ("hash_tables", {"test_case[reused_row-ebc-row_wise-key_value-adam]"},
                              "does not train as a new row"),
    "saver_row": ("checkpoint", {"test_case[round_trip-ebc-row_wise-key_value-adam-default-row_wise-key_value-2]"},
                  "do not restore"),
    "kv_state_dict_placeholder": ("checkpoint", {REFUSED.format("dcp", "adam", "loaded")}, "'user'"),
    # Stock PrefetchTrainPipelineSparseDist over KEY_VALUE: its first prefetch must wait for the pool's first rows
    # (only the emulated NPU's stream-order check sees it).
    "first_prefetch_unordered": ("sharding", {"test_case[pipeline-prefetch-key_value]"},
                                 "with nothing ordering the two"),
    # Out-of-range ADAM hyper-parameters are refused at sharding.
    "adam_betas_unchecked": ("errors", {"test_catalogue[configs-adam_beta_out_of_range]"}, "raised no ConfigError"),
    # A plan whose KEY_VALUE caches do not fit the topology's hbm_cap is refused at planning time.
    "cache_estimate_zero": ("errors", {"test_catalogue[constraints-caches_past_hbm]"}, "raised no PlannerError"),
    # Stock state_dict() of FUSED hash tables: weight_id restores the IDs; the not-admitted row stays hidden.
    "weight_ids_ignored": ("hash_tables", {"test_case[ebc-row_wise-rowwise_adagrad-row_wise]",
                                           "test_case[ebc-row_wise-rowwise_adagrad-table_wise]",
                                           "test_case[ebc-data_parallel-rowwise_adagrad-data_parallel]"},
                           "from the model that never stopped"),
    "reserved_row_shown": ("hash_tables", {"test_case[ebc-row_wise-rowwise_adagrad-row_wise]",
                                           "test_case[ebc-table_wise-rowwise_adagrad-table_wise]"},
                           "the not-admitted row shows in the state_dicts"),
    # The Saver's tables and stock DCP together (dense_state_dict).
    "dense_drops_plain": ("checkpoint", {"test_case[dense]"}, "outputs after loading both paths differ"),
    # HybridTrainPipelineSparseDist: end of data, detach(), a failure naming its stage and batch.
    "last_batches_dropped": ("pipeline", {"test_case[end_of_data-row_wise-3-6-True]"}, "batches trained, expected"),
    "detach_drops_batches": ("pipeline", {"test_case[detach-row_wise-4-10-5]"}, "batches trained, expected"),
    "stage_error_misnamed": ("pipeline", {"test_case[raise-split-3-3]"}, "the error names"),
    # Hash tables in eval: unknown IDs read the not-admitted vector and get no row.
    "eval_assigns_rows": ("hash_tables", {"test_case[ebc-row_wise-rowwise_adagrad-eval]"}, "oracle"),
    # FUSED hash tables through DCP: rows without their IDs, IDs on a shard that does not own them, are refused.
    "rows_without_ids_accepted": ("checkpoint", {
        "test_case[dcp-ebc-row_wise-fused-adagrad-default-row_wise-fused-2-refused-rows_without_ids]"},
        "must be refused saying"),
    "misplaced_ids_accepted": ("checkpoint", {
        "test_case[dcp-ebc-table_wise-fused-rowwise_adagrad-default-row_wise-fused-2-refused-model_only]"},
        "must be refused saying"),
    # Fused ADAM against torch.optim.Adam (bias correction by the step count).
    "adam_step_off_by_one": ("hash_tables", {"test_case[ebc-row_wise-adam]"}, "oracle"),
    # KEY_VALUE: evaluation reads every tier; 16-bit rows travel through the tiers exactly, BF16 rounds as FUSED.
    "tiers_unread_in_eval": ("key_value", {"test_case[ebc-row_wise-rowwise_adagrad-30-64-8-eval]"}, "not bit for bit"),
    "fp16_rows_rounded": ("key_value", {"test_case[ebc-row_wise-rowwise_adagrad-30-64-8-fp16]"}, "not bit for bit"),
    "bf16_noise_by_slot": ("key_value", {"test_case[ebc-row_wise-rowwise_adagrad-30-64-8-bf16]"}, "not bit for bit"),
    # Stock modules through our injection hooks: DMP.copy(), the backward of per-rank batch sizes that differ (an
    # empty batch, VBE), PrefetchTrainPipelineSparseDist's prefetch step without streams.
    "copy_deep_copies_groups": ("sharding", {"test_case[copy]"}, "cannot pickle"),
    "uneven_gradient_reversed": ("sharding", {"test_case[ebc-row_wise-rowwise_adagrad-variable-variable]",
                                              "test_case[ebc-row_wise-rowwise_adagrad-empty-empty]",
                                              "test_case[ebc-row_wise-rowwise_adagrad-vbe-vbe]"},
                                 "forward output differs from the unsharded reference"),
    # ... and on a device with streams, TorchRec's pipelines get the device's (they copy on a stream of their own).
    "streams_unfilled": ("sharding", {"test_case[pipeline]", "test_case[pipeline-sparse_dist-key_value]",
                                      "test_case[pipeline-prefetch-fused]", "test_case[pipeline-eval-fused]",
                                      "test_case[pipeline-eval-key_value]"}, "on a stream of its own"),
    "prefetch_left_to_streams": ("sharding", {"test_case[pipeline-prefetch-fused]",
                                              "test_case[pipeline-prefetch-key_value]"},
                                 "Invalid PrefetchPipelinedForward usage"),
}
#: The full-run faults only the emulated NPU can see, and those of a path only the CPU takes (no streams).
EMULATED_ONLY = {"first_prefetch_unordered", "streams_unfilled"}
CPU_ONLY = {"prefetch_left_to_streams"}


FULL_RUN_ROUNDS = [(round_, device) for device, left_out in (("cpu", EMULATED_ONLY), ("emulated_npu", CPU_ONLY))
                   for round_ in fault_rounds({f: v for f, v in FULL_RUN_FAULTS.items() if f not in left_out})]


@pytest.mark.teeth
@pytest.mark.parametrize("round_, device", FULL_RUN_ROUNDS, ids=[f"{device}-{round_id(r)}"
                                                                for r, device in FULL_RUN_ROUNDS])
def test_a_broken_part_of_ours_fails_its_full_run_cases(round_: Tuple[str, Tuple[str, ...]], device: str,
                                                        fault_site: Path, tmp_path: Path, request: Any) -> None:
    """Each fault above on the cases it must fail (a full run's, picked with ``--case``)."""
    if device == "emulated_npu":
        request.getfixturevalue("emulated_npu")
    argv = EMULATED if device == "emulated_npu" else ["conformance"]
    run_round_on_its_cases(FULL_RUN_FAULTS, round_, argv, fault_site, tmp_path)


UNSHARDED_STEPS = "test_case[policy_steps-ebc-unsharded-fused]"


@pytest.mark.teeth
def test_a_dropped_device_transfer_fails_the_emulated_run(emulated_npu: None, fault_site: Path,
                                                          tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(fault_site), "TORCHREC_ASCEND_TEST_FAULT": "transfer_dropped"}
    status, output, outcomes = run_cli(EMULATED + ["--quick", "--only", "hash_tables"], tmp_path, env)
    assert status == 1, output
    # Every case through the sharded kernels' ID mapper fails; the unsharded module maps IDs without it.
    assert outcomes and {c for c, o in outcomes.items() if o != "failed"} == {UNSHARDED_STEPS}, output
    assert "Expected all tensors to be on the same device" in output, output


#: Faults only the emulated NPU's stream-order check sees (the numbers stay right there): fault -> (the quick check
#: that runs the broken part, what the failure says).
STREAM_FAULTS = {
    "stage_wait_missing": ("pipeline", "with nothing ordering the two"),
    "record_stream_missing": ("pipeline", "no record_stream"),
    "host_read_in_flight": ("hash_tables", "host read of a pinned buffer"),
    "prefetched_rows_unrecorded": ("key_value", "no record_stream"),
}


@pytest.mark.teeth
@pytest.mark.parametrize("fault", sorted(STREAM_FAULTS))
def test_a_stream_order_fault_fails_the_emulated_run(fault: str, emulated_npu: None, fault_site: Path,
                                                     tmp_path: Path) -> None:
    from torchrec_ascend.testing.emulated_npu import STREAM_CHECK

    check, phrase = STREAM_FAULTS[fault]
    # The rank that fails leaves the other in a collective: 20 s of waiting is enough to fail (the default: 120 s).
    env = {"PYTHONPATH": str(fault_site), "TORCHREC_ASCEND_TEST_FAULT": fault,
           "TORCHREC_ASCEND_COLLECTIVE_TIMEOUT_S": "20"}
    status, output, outcomes = run_cli(EMULATED + ["--quick", "--only", check], tmp_path, env)
    assert status == 1 and "failed" in outcomes.values(), output
    assert STREAM_CHECK in output and phrase in output, output


#: Device memory for the run with the oversized cache: the quick KEY_VALUE cases need under 1 MiB per rank; the
#: broken cache asks for more than this at its first table.
SMALL_DEVICE_MEMORY = 16 << 20


@pytest.mark.teeth
def test_a_cache_past_device_memory_fails_the_emulated_run(emulated_npu: None, fault_site: Path,
                                                            tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(fault_site), "TORCHREC_ASCEND_TEST_FAULT": "cache_past_memory"}
    argv = EMULATED + ["--emulate-memory", str(SMALL_DEVICE_MEMORY), "--quick", "--only", "key_value"]
    status, output, outcomes = run_cli(argv, tmp_path, env)
    assert status == 1 and "failed" in outcomes.values(), output
    assert "NPU out of memory. Tried to allocate" in output, output


@pytest.mark.teeth
def test_a_sync_on_the_compute_thread_behind_the_pipeline_fails_the_emulated_run(
        emulated_npu: None, fault_site: Path, tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(fault_site), "TORCHREC_ASCEND_TEST_FAULT": "prefetch_check_syncs"}
    status, output, outcomes = run_cli(EMULATED + ["--quick", "--only", "key_value"], tmp_path, env)
    assert status == 1, output
    assert {c for c, o in outcomes.items() if o != "passed"} == {COMPUTE_BUDGET_CASE, FUSED_BUDGET_CASE}, output
    for kernel in ("key_value", "fused_hash"):  # one sync per kernel, 2 kernels a rank
        over = f"host<->device traffic over budget: {kernel}_pipeline_compute_thread: "
        assert over + "2.00 syncs per call, budget 0" in output, output


@pytest.mark.teeth
def test_a_per_step_item_fails_the_emulated_run(emulated_npu: None, fault_site: Path, tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(fault_site), "TORCHREC_ASCEND_TEST_FAULT": "item_per_step"}
    status, output, outcomes = run_cli(EMULATED + ["--quick", "--only", "hash_tables"], tmp_path, env)
    assert status == 1 and "failed" in outcomes.values(), output
    assert "host<->device traffic over budget: fused_hash" in output and "syncs per call" in output, output

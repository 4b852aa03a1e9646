"""The emulated NPU (torchrec_ascend.testing.emulated_npu): device, memory, counters, streams, fbgemm, collectives.

Oracles: torch's own CPU results and CUDA rules (same-device check, 0-dim CPU scalars allowed), fbgemm's CPU
kernels, arithmetic of the collectives, and exact counts derived from what each call moves.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Dict

import pytest

from fresh_interpreter import start_all

HERE = Path(__file__).resolve().parent
ZERO = {"h2d": 0, "h2d_bytes": 0, "d2h": 0, "d2h_bytes": 0, "d2d": 0, "syncs": 0}


def _program(name: str) -> Dict[str, Any]:
    paths = os.pathsep.join([str(HERE.parent / "foundation"), str(HERE)])
    return {"code": f"from emulator_probe import main; main({name!r})", "env": {"PYTHONPATH": paths}, "timeout": 300}


@pytest.fixture(scope="module")
def children() -> Dict[str, "Future[Dict[str, Any]]"]:
    names = ("collectives", "sharded", "device", "fbgemm", "tbe", "ebc", "pipeline", "activation")
    return start_all({name: _program(name) for name in names})


@pytest.fixture(scope="module")
def device(children: Dict[str, "Future[Dict[str, Any]]"]) -> Dict[str, Any]:
    return children["device"].result()


@pytest.fixture(scope="module")
def fbgemm(children: Dict[str, "Future[Dict[str, Any]]"]) -> Dict[str, Any]:
    return children["fbgemm"].result()


def counts(**nonzero: int) -> Dict[str, int]:
    return {**ZERO, **nonzero}


def test_presents_npu_like_torch_npu(device: Dict[str, Any]) -> None:
    assert device["backend_name"] == "npu" and device["module"] is True
    assert device["api"] == [True, 2, 0]
    assert device["tensor"] == [True, True, "npu:0"]
    assert device["module_npu"] == "npu:0"
    assert device["after_set_device"] == [1, "npu:1"] and device["device_context"] == 0
    assert "npu:5 is not a device of the emulated npu (it has 2 devices" in device["bad_device"]
    assert "cannot change it to 3" in device["reinstall_other_count"]


def test_mixing_devices_fails_as_on_hardware(device: Dict[str, Any]) -> None:
    same = "Expected all tensors to be on the same device, but found at least two devices"
    assert device["mix_add"].startswith(f"RuntimeError: {same}, npu:0 and cpu!")
    assert same in device["mix_mm"] and same + ", npu:0 and npu:1!" in device["mix_devices"]
    assert device["scalar_ok"] == "npu:0" and device["cpu_index"] == [0, 4]
    assert device["numpy"].startswith("TypeError: can't convert npu:0 device type tensor to numpy")


@pytest.mark.parametrize(
    "case, expected",
    [
        ("to_npu", counts(h2d=1, h2d_bytes=40)),
        ("item", counts(syncs=1)),
        ("int", counts(syncs=1)),
        ("bool", counts(syncs=1)),
        ("tolist", counts(d2h=1, d2h_bytes=40, syncs=1)),
        ("cpu", counts(d2h=1, d2h_bytes=40, syncs=1)),
        ("to_cpu_non_blocking", counts(d2h=1, d2h_bytes=40)),
        ("compute", counts(d2d=1)),  # the .float() is a device-side copy; the arithmetic moves nothing
        ("nonzero", counts(syncs=1)),
        ("equal", counts(syncs=1)),
        ("synchronize", counts(syncs=1)),
        ("device_to_device", counts(d2d=1)),
        ("pinned_copy", counts(h2d=1, h2d_bytes=16)),
    ],
)
def test_counters_count_exactly(device: Dict[str, Any], case: str, expected: Dict[str, int]) -> None:
    assert device[case] == expected


def test_counters_are_per_thread(device: Dict[str, Any]) -> None:
    assert device["per_thread"] == {"MainThread": counts(syncs=1), "side": counts(d2h=1, d2h_bytes=32, syncs=1)}


def test_device_memory_semantics(device: Dict[str, Any]) -> None:
    assert device["views"] == [0.0, 7.0, 0.0, 0.0, 8.0, 1.0]  # writes through views land in the base tensor
    assert device["out_resized"] == ["npu:0", [0, 1, 3, 6, 10]]
    assert device["grad"] == ["npu:0", [2.0, -4.0, 6.0]]
    assert device["memory"] == [4000, 0]


def test_pinned_memory(device: Dict[str, Any]) -> None:
    assert device["pinned"] == [True, False, True]


def test_streams_are_per_thread(device: Dict[str, Any]) -> None:
    assert device["main_inside"] is True
    assert device["thread"] == {"before": 0, "inside": True}  # the main thread's stream is not the other's
    assert device["streams"] == [-1, True, True]
    assert device["events"] == [True, True] and device["record_stream_ok"] is True


def test_host_only_operator_has_no_npu_kernel(device: Dict[str, Any]) -> None:
    assert device["cpu_only_op"].startswith("NotImplementedError: Could not run 'emuprobe::double' with arguments")
    assert device["cpu_only_op_on_cpu"] == [2.0]


def test_fbgemm_ops_run_on_npu_tensors_like_on_cpu(fbgemm: Dict[str, Any]) -> None:
    assert fbgemm["provided_count"] > 100
    cpu, npu, where = fbgemm["cumsum"]
    assert cpu == npu == [0, 2, 2, 5, 6] and where == "npu:0"
    assert fbgemm["cumsum_counts"] == counts(h2d=1, h2d_bytes=32)  # the lengths' upload only
    assert fbgemm["permute_equal"] is True


def test_per_backend_autograd_of_fbgemm_ops_runs_on_npu(fbgemm: Dict[str, Any]) -> None:
    assert fbgemm["split_permute"] == [True, "npu:0", True, "npu:0"]


def test_withheld_op_has_no_npu_kernel(fbgemm: Dict[str, Any]) -> None:
    assert fbgemm["withheld"] == ["fbgemm::block_bucketize_sparse_features"]
    assert fbgemm["held_names"] == ["fbgemm::asynchronous_complete_cumsum"]
    assert fbgemm["held_error"].startswith("NotImplementedError: Could not run 'fbgemm::asynchronous_complete_cumsum'")
    assert fbgemm["held_has_kernel"] is False
    assert fbgemm["restored"] == [0, 2, 2, 5, 6]
    assert "no operator 'fbgemm::no_such_op_anywhere'" in fbgemm["unknown_name"]


def test_host_fallback_runs_for_withheld_ops(fbgemm: Dict[str, Any]) -> None:
    assert "withholds its kernel" in fbgemm["bucketize_error"]
    # H6 gives a host round trip exactly to the listed ops without an npu kernel (one has no CPU kernel at all).
    assert fbgemm["h6_registered"] == ["fbgemm::block_bucketize_sparse_features", "fbgemm::jagged_unique_indices"]
    assert fbgemm["bucketize_equal"] is True and set(fbgemm["bucketize_devices"]) == {"npu:0"}
    moved = fbgemm["bucketize_counts"]
    assert moved["d2h"] == 3 and moved["syncs"] == 3 and moved["h2d"] >= 3  # the round trip's traffic is visible


def test_collectives_over_the_hccl_role_backend(children: Dict[str, "Future[Dict[str, Any]]"]) -> None:
    facts = children["collectives"].result()
    assert facts["exit"] == [0, 0]
    r0, r1 = facts["ranks"]["0"], facts["ranks"]["1"]
    for rank, r in enumerate((r0, r1)):
        assert r["backend"] == "cpu:gloo,npu:hccl"
        assert r["devices"] == [f"npu:{rank}"]
        assert r["all_reduce"] == [3.0, 3.0, 3.0]
        assert r["all_gather"] == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]
        assert r["all_gather_list"] == [[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]]
        assert r["host_all_reduce"] == [2.0, 2.0]
        assert r["counts"] == counts(h2d=1, h2d_bytes=8)  # only the torch.tensor([...], device=...) upload
        assert "No backend type associated with device type npu" in r["mixed_error"]
    assert r0["all_to_all"] == [0.0, 10.0, 11.0] and r1["all_to_all"] == [1.0, 2.0, 12.0]
    assert r0["reduce_scatter"] == [3.0] and r1["reduce_scatter"] == [6.0]


@pytest.mark.parametrize("optimizer", ["EXACT_SGD", "EXACT_ROWWISE_ADAGRAD"])
def test_tbe_on_the_accelerator_layout_trains_like_fbgemm_cpu(
    children: Dict[str, "Future[Dict[str, Any]]"], optimizer: str
) -> None:
    steps = children["tbe"].result()[optimizer]
    assert len(steps) == 4  # the last one's loss is a plain sum: its gradient is a temporary on the device
    for step in steps:
        assert step["output_equal"] is True and step["weights_diff"] == 0.0
        assert step["device"] == step["weights_device"] == "npu:0"
    # per step: the batch's indices and offsets go up; nothing comes back (fbgemm's rowwise adagrad reads one
    # 8-byte scalar on its first step only)
    assert [s["counts"] for s in steps[1:3]] == [counts(h2d=2, h2d_bytes=96)] * 2
    assert steps[3]["counts"] == counts(h2d=2, h2d_bytes=96, d2d=1)  # the expanded gradient made dense


def test_stock_embedding_bag_collection_on_npu(children: Dict[str, "Future[Dict[str, Any]]"]) -> None:
    facts = children["ebc"].result()
    assert facts["output_equal"] is True and facts["output_device"] == "npu:0"
    assert facts["grads"] == {"embedding_bags.t1.weight": ["npu:0", True], "embedding_bags.t2.weight": ["npu:0", True]}
    assert facts["upload"] == counts(h2d=2, h2d_bytes=80)  # values and lengths
    assert facts["step"] == ZERO  # forward and backward on the device move nothing and never wait


@pytest.mark.parametrize("sharding", ["table_wise", "row_wise"])
def test_stock_dmp_on_two_emulated_npus_equals_the_cpu_run(
    children: Dict[str, "Future[Dict[str, Any]]"], sharding: str
) -> None:
    facts = children["sharded"].result()
    assert facts["exit"] == [0, 0]
    for rank in (0, 1):
        r = facts["ranks"][str(rank)][sharding]
        assert r["first_equal"] is True and r["second_equal"] is True  # forward, fused update, forward again
        assert r["trained"] is True
        assert r["devices"] == [f"npu:{rank}"]  # every non-empty parameter and the output
        assert r["placements"] == ["rank:0/npu:0", "rank:1/npu:1"]


def test_stock_pipeline_and_model_copy_on_npu(children: Dict[str, "Future[Dict[str, Any]]"]) -> None:
    facts = children["pipeline"].result()
    assert facts["streams"] == ["Stream", True, -1]  # torch.npu streams, the npu profile's data_dist priority
    assert facts["losses"] == ["npu:0"] * 3
    assert facts["copy_devices"] == ["npu:0"] and facts["copy_shares_group"] is True


def test_installed_emulator_is_the_npu_emulated_backend(children: Dict[str, "Future[Dict[str, Any]]"]) -> None:
    facts = children["activation"].result()
    assert "npu_emulated" not in facts["before"] and "npu_emulated" in facts["after"]
    assert [facts["name"], facts["device_type"], facts["collective"]] == ["npu_emulated", "npu", "hccl"]
    assert facts["description"].startswith("EMULATED npu") and facts["by_type"] == "npu"
    # the registry's H6 entry gave the withheld op (and the op without any kernel) the host round trip
    assert facts["host_fallbacks"] == ["fbgemm::block_bucketize_sparse_features", "fbgemm::jagged_unique_indices"]

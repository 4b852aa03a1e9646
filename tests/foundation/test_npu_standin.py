"""The NPU backend's wiring, with STAND-INS for torch_npu and fbgemm_ascend (tests/standins): nothing runs on an NPU.

Fresh interpreters get the stand-ins first on PYTHONPATH. Oracles: the placements TorchRec gives cuda with the
device renamed (``rank:r/npu:r``), the NPU profile's declared priorities, bandwidths, HBM and fallback ops, and the
stand-in's own list of natively supported ops.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Dict

import pytest

from fresh_interpreter import start_all
from torchrec_ascend.backends.npu import NPU

SELECTION = """
import os, warnings, torch
from fresh_interpreter import report
from torchrec_ascend import backends
from torchrec_ascend.errors import BackendError
facts = {}
os.environ["TORCH_NPU_STANDIN_IMPORT_ERROR"] = "libascendcl.so: cannot open shared object file"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        facts["error"] = "activated: " + backends.activate().name
    except BackendError as err:
        facts["error"], facts["cause"] = str(err), type(err.__cause__).__name__
facts["warnings_without_switch"] = [str(w.message) for w in caught]
backends.reset_for_tests()
os.environ["TORCHREC_ASCEND_ALLOW_FALLBACK"] = "1"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    facts["fallback"] = backends.activate().name
facts["fallback_warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
backends.reset_for_tests()
del os.environ["TORCH_NPU_STANDIN_IMPORT_ERROR"], os.environ["TORCHREC_ASCEND_ALLOW_FALLBACK"]
facts["auto"] = backends.activate().name
report(facts)
"""

DOCTOR = """
import contextlib, io
from fresh_interpreter import report
from torchrec_ascend.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = main(["doctor"])
report({"status": status, "text": out.getvalue()})
"""

NPU_ENV = {"TORCHREC_ASCEND_DEVICE": "npu"}
ROW_WISE = ["rank:0/npu:0", "rank:1/npu:1"]


@pytest.fixture(scope="module")
def children() -> Dict[str, "Future[Dict[str, Any]]"]:
    return start_all(
        {
            "probe": {"code": "import npu_wiring_probe", "env": NPU_ENV, "standins": True},
            "selection": {"code": SELECTION, "standins": True},
            "doctor": {"code": DOCTOR, "env": NPU_ENV, "standins": True},
        }
    )


@pytest.fixture(scope="module")
def probe(children: Dict[str, Future]) -> Dict[str, Any]:
    return children["probe"].result()


def test_activation_imports_the_standins_and_applies_every_patch(probe: Dict[str, Any]) -> None:
    assert probe["selected"] == "npu"
    assert probe["standins"] == {"torch_npu": True, "fbgemm_ascend": True}
    assert probe["patches"] and set(probe["patches"].values()) == {"applied"}


@pytest.mark.parametrize("kernel", ["fused", "key_value"])
@pytest.mark.parametrize("sharding_type", ["row_wise", "table_wise"])
def test_stock_planner_plans_npu_with_real_placements(probe: Dict[str, Any], kernel: str, sharding_type: str) -> None:
    """H1 (alias + placement rewrite) and H3 (no perf-estimator error for npu kernels)."""
    plan = probe["plans"][f"{kernel}/{sharding_type}"]
    assert plan["kernels"] == [kernel]
    shards = plan["placements"]
    if sharding_type == "row_wise":
        assert all(p == ROW_WISE for p in shards.values())
    else:
        assert all(len(p) == 1 and p[0] in ROW_WISE for p in shards.values())
        assert {p[0] for p in shards.values()} == set(ROW_WISE), "table-wise spreads tables over both devices"


def test_npu_planning_offers_only_npu_kernels(probe: Dict[str, Any]) -> None:
    """Planned as cuda, npu must not be offered cuda's UVM kernels (nor by the managed-collision sharder)."""
    kernels = {option.split("/")[1] for option in probe["enumerated"]}
    assert kernels == {"dense", "fused"}, "key_value is guarded: offered only when constraints name it"
    types = {option.split("/")[0] for option in probe["enumerated"]}
    assert types == set(NPU.sharding_types) - {"grid_shard"}, "grid needs constraints that name it"
    assert probe["mc_kernels"] == [k for k in ("fused", "key_value") if k in NPU.compute_kernels]


def test_npu_planning_uses_the_npu_profile_constants(probe: Dict[str, Any]) -> None:
    assert probe["hbm_per_device"] == NPU.planner.hbm_cap_bytes
    for kernel, bandwidth in NPU.planner.kernel_bandwidths.items():
        assert probe["bandwidths"][f"npu/{kernel}"] == bandwidth
        assert probe["bandwidths"][f"cuda/{kernel}"] == bandwidth, "the estimator sees npu as its alias, cuda"


def test_explicit_plans_and_defaults_name_the_npu(probe: Dict[str, Any]) -> None:
    assert probe["default_devices"] == {"planners": "npu", "sharding_plan": "npu"}
    assert all(p == ROW_WISE for p in probe["explicit_plan"].values()), "TorchRec would write rank:r/npu"


PIPELINE_STREAMS = {
    "TrainPipelineBase": {"_memcpy_stream": "memcpy"},
    "TrainPipelineSparseDist": {"_memcpy_stream": "memcpy", "_data_dist_stream": "data_dist"},
    "TrainPipelineFusedSparseDist": {
        "_memcpy_stream": "memcpy",
        "_data_dist_stream": "data_dist",
        "_emb_lookup_stream": "emb_lookup",
    },
    "TrainPipelineSemiSync": {"_memcpy_stream": "memcpy", "_data_dist_stream": "data_dist"},
    "PrefetchTrainPipelineSparseDist": {
        "_memcpy_stream": "memcpy",
        "_data_dist_stream": "data_dist",
        "_prefetch_stream": "prefetch",
        "_default_stream": None,
    },
    "EvalPipelineSparseDist": {"_memcpy_stream": "memcpy", "_data_dist_stream": "data_dist"},
    "TrainPipelineSparseDistLite": {"_memcpy_stream": "memcpy"},
    "StagedTrainPipeline": {},
    "SparseDataDistUtil": {"_default_stream": None},
}


@pytest.mark.parametrize("pipeline", sorted(PIPELINE_STREAMS))
def test_pipelines_get_npu_streams_with_the_profile_priorities(probe: Dict[str, Any], pipeline: str) -> None:
    """H4: every stream TorchRec would create on cuda is an npu stream with the role's declared priority."""
    facts = probe["pipelines"][pipeline]
    assert facts["stream_context_is_npu_stream"]
    for attr, role in PIPELINE_STREAMS[pipeline].items():
        stream = facts[attr]
        assert stream is not None, f"{pipeline}.{attr} left empty"
        assert stream["module"] == "torch_npu.npu" and stream["class"] == "Stream"
        if role is not None:  # _default_stream is the current stream
            assert stream["priority"] == NPU.streams.priorities[role]
    if pipeline == "TrainPipelineSparseDistLite":
        assert facts["_data_dist_stream"] is None, "Lite drops its data-dist stream on purpose"


def test_collective_outputs_are_recorded_on_the_npu_stream(probe: Dict[str, Any]) -> None:
    assert probe["comm"] == {"returned_output": True, "recorded_on_current_stream": True}


def test_model_copy_shares_npu_streams_and_the_hccl_group(probe: Dict[str, Any]) -> None:
    facts = probe["model_copy"]
    assert {"torch_npu.npu.Stream", "torch_npu._C._distributed_c10d.ProcessGroupHCCL"} <= set(facts["no_copy"])
    assert facts["stream_shared"] and facts["pg_shared"] and facts["classes_restored"]


def test_fbgemm_ops_without_an_npu_kernel_get_the_host_round_trip(probe: Dict[str, Any]) -> None:
    """H6: every listed op has a PrivateUse1 kernel; ours only where fbgemm_ascend (stand-in) has none."""
    ops = probe["sparse_ops"]
    assert ops["listed"] == list(NPU.host_fallback_ops)
    assert all(ops["has_kernel"].values())
    assert ops["registered"] == [f"fbgemm::{op}" for op in ops["listed"] if op not in ops["native"]]
    assert set(ops["native"]) <= set(ops["listed"]), "the stand-in must exercise the skip path"


def test_broken_torch_npu_is_an_error_unless_fallback_is_asked(children: Dict[str, Future]) -> None:
    facts = children["selection"].result()
    assert "'npu' backend" in facts["error"]
    assert "ImportError: libascendcl.so: cannot open shared object file" in facts["error"]
    assert "TORCHREC_ASCEND_ALLOW_FALLBACK=1" in facts["error"]
    assert facts["cause"] == "ImportError"
    assert facts["warnings_without_switch"] == [], "no silent (or warned) fallback"
    assert facts["fallback"] == "cpu"
    assert any("libascendcl.so" in w and "Falling back to CPU" in w for w in facts["fallback_warnings"])
    assert facts["auto"] == "npu", "with a working torch_npu, auto selects the npu backend"


def test_doctor_on_the_npu_backend(children: Dict[str, Future]) -> None:
    facts = children["doctor"].result()
    text = facts["text"]
    assert facts["status"] == 0, text
    assert "Device backend: npu (requested: npu)" in text
    assert "ops served by a host round trip:" in text and "fbgemm::block_bucketize_sparse_features" in text
    assert [line for line in text.splitlines() if len(line) > 100] == []

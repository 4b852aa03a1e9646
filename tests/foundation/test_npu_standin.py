"""The NPU backend's wiring, with STAND-INS for torch_npu and fbgemm_ascend (tests/standins): nothing runs on an NPU.

Fresh interpreters get the stand-ins first on PYTHONPATH. Oracles: the placements TorchRec gives cuda with the
device renamed (``rank:r/npu:r``), the NPU profile's declared priorities, bandwidths, HBM and fallback ops, and the
stand-in's own list of natively supported ops.
"""

from __future__ import annotations

import re
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

# fbgemm-ascend built for another torch: what `import fbgemm_ascend` says (fbgemm-ascend 1.5.0 on torch 2.13/2.14).
ABI_ERROR = "fbgemm_ascend_py_a2a3.so: undefined symbol: _ZN3c1013MessageLoggerC1EPKciib"
NO_KERNELS = """
import contextlib, io, warnings
import torch
from fresh_interpreter import report
facts = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torchrec
    from torchrec_ascend import backends
    facts["selected"] = backends.activate().name
facts["load_warnings"] = [str(w.message) for w in caught if "fbgemm_ascend" in str(w.message)]
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.cli import main
def embedding_bags():
    configs = [torchrec.EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=1000, feature_names=[f"f{i}"])
               for i in range(3)]
    return torchrec.EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
for device in ("npu", "cpu"):
    try:
        plan = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device=device)).plan(
            embedding_bags(), [EmbeddingBagCollectionSharder()])
        facts[device] = sorted({p.compute_kernel for p in plan.plan[""].values()})
    except ConfigError as err:
        facts[device] = "ConfigError: " + str(err)
out = io.StringIO()
with contextlib.redirect_stdout(out):
    facts["status"] = main(["doctor"])
facts["doctor"] = out.getvalue()
report(facts)
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
            "no_kernels": {
                "code": NO_KERNELS,
                "env": {**NPU_ENV, "FBGEMM_ASCEND_STANDIN_IMPORT_ERROR": ABI_ERROR},
                "standins": True,
            },
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


def test_semi_sync_pipeline_is_refused_on_npu_naming_the_alternatives(probe: Dict[str, Any]) -> None:
    refused = probe["pipelines"]["TrainPipelineSemiSync"]["refused"]
    assert "TrainPipelineSemiSync is not supported on npu" in refused and "TrainPipelineSparseDist" in refused


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
    assert set(ops["native"]) & set(ops["listed"]), "the stand-in must exercise the skip path"
    assert set(ops["native"]) <= set(ops["listed"]) | set(NPU.device_tbe_ops)


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
    assert "Device ops (npu):\n  fbgemm_ascend     loaded" in text
    for op in NPU.host_fallback_ops:
        state = "device kernel" if op in ("asynchronous_complete_cumsum", "permute_2D_sparse_data") else "host fallback"
        assert re.search(rf"  {op} +{state}", text), op
    for op in NPU.device_tbe_ops:
        assert re.search(rf"  {op} +device kernel", text), op
    assert [line for line in text.splitlines() if len(line) > 100] == []


def test_without_loadable_device_kernels_ops_fall_back_and_device_planning_is_refused(
    children: Dict[str, Future],
) -> None:
    """fbgemm_ascend fails to import (ABI): the backend still starts, doctor shows the error and per op the host
    fallback, and planning tables on the npu is refused naming the missing TBE op and both choices."""
    facts = children["no_kernels"].result()
    assert facts["selected"] == "npu"
    assert len(facts["load_warnings"]) == 1 and ABI_ERROR in facts["load_warnings"][0]
    refused = facts["npu"]
    assert refused.startswith("ConfigError: cannot plan") and ABI_ERROR in refused, refused
    assert f"fbgemm::{NPU.device_tbe_ops[0]}" in refused
    assert "fbgemm_ascend" in refused and "plan these tables on the host" in refused
    assert facts["cpu"] == ["fused"], "tables planned on the host are not refused"
    text = facts["doctor"]
    assert facts["status"] == 0, text
    assert "  fbgemm_ascend     NOT LOADED: ImportError: fbgemm_ascend_py_a2a3.so: undefined symbol:" in text
    for op in NPU.host_fallback_ops:
        assert re.search(rf"  {op} +host fallback \(0 calls\)", text), op
    for op in NPU.device_tbe_ops:
        assert re.search(rf"  {op} +no kernel: device planning refused", text), op

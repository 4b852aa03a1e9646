"""The Ascend NPU backend: torch_npu (PrivateUse1 renamed "npu"), HCCL collectives, fbgemm-ascend sparse ops.

fbgemm-ascend is optional: no release loads against torch 2.13/2.14 (1.5.0 was built for torch 2.10), so build it
from source against your torch and torch-npu. Without it, every sparse op runs through the host fallback (counted,
a warning per op) and planning embedding tables on the npu is refused, naming the missing device TBE op;
``torchrec-ascend doctor`` shows why fbgemm_ascend did not load and, per op, device kernel or host fallback.

Bound, not yet run on hardware by this project: check an installation with ``torchrec-ascend conformance --device
npu`` on an Ascend host.
"""

from __future__ import annotations

import importlib.util

from torchrec_ascend.backends.profile import DeviceProfile, PlannerSpec, StreamSpec, TbeSpec
from torchrec_ascend.versions import STACKS

# Atlas 800T A2: 64 GB of HBM per NPU; TorchRec's HBM bandwidth constant scaled to the 910B's ~1.6 TB/s.
_NPU_HBM_BYTES = 64 * 1024**3
_NPU_HBM_BYTES_PER_MS = 1600 * 1024**3 / 1000


def _torch_npu_installed() -> bool:
    return importlib.util.find_spec("torch_npu") is not None


NPU = DeviceProfile(
    name="npu",
    device_type="npu",
    description="Ascend NPU via torch_npu, HCCL collectives, fbgemm-ascend ops",
    collective_backend="hccl",
    priority=20,
    detect=_torch_npu_installed,
    requires_modules=("torch_npu",),
    # fbgemm_gpu defines the fbgemm:: op schemas; fbgemm_ascend (optional) adds Ascend kernels for them.
    op_modules=("fbgemm_gpu",),
    optional_op_modules=("fbgemm_ascend",),
    # fbgemm's TBE on an accelerator (EmbeddingLocation.DEVICE) calls these, one per fused optimizer below; ADAM and
    # PARTIAL_ROWWISE_ADAM look up with the SGD one and step in torchrec_ascend.kernels.fused_optimizers.
    device_tbe_ops=(
        "split_embedding_codegen_lookup_sgd_function_pt2",
        "split_embedding_codegen_lookup_adagrad_function_pt2",
        "split_embedding_codegen_lookup_rowwise_adagrad_function_pt2",
    ),
    # fbgemm ops TorchRec's training path dispatches that fbgemm-ascend may lack on some SoCs (A2/A3).
    host_fallback_ops=(
        "block_bucketize_sparse_features",
        "permute_2D_sparse_data",
        "permute_1D_sparse_data",
        "asynchronous_complete_cumsum",
        "permute_pooled_embs_auto_grad",
        "segment_sum_csr",
        "expand_into_jagged_permute",
        "invert_permute",
        "jagged_unique_indices",
    ),
    sharding_types=(
        "data_parallel",
        "table_wise",
        "column_wise",
        "table_column_wise",
        "row_wise",
        "table_row_wise",
        "grid_shard",
    ),
    compute_kernels=("fused", "key_value"),
    fused_optimizers=("EXACT_SGD", "EXACT_ADAGRAD", "EXACT_ROWWISE_ADAGRAD", "ADAM", "PARTIAL_ROWWISE_ADAM"),
    # BF16 weights (FP32 state): fbgemm has no BF16 CPU lookup, so torchrec_ascend.kernels.fused_optimizers trains them.
    weight_dtypes=("FP32", "FP16", "BF16"),
    tbe=TbeSpec(location="DEVICE", compute_device="CUDA"),  # fbgemm's accelerator path; ops dispatch to PrivateUse1
    streams=StreamSpec(
        device_module="torch.npu",
        priorities={"memcpy": 0, "data_dist": -1, "prefetch": 0, "emb_lookup": 0},
    ),
    # The stock planner knows HBM semantics only as "cuda": plan as cuda, place on npu.
    planner=PlannerSpec(
        alias="cuda",
        hbm_cap_bytes=_NPU_HBM_BYTES,
        kernel_bandwidths={"fused": _NPU_HBM_BYTES_PER_MS, "key_value": _NPU_HBM_BYTES_PER_MS / 4},
    ),
    # TorchRec's sequence dense kernel is fbgemm's dense TBE, which pools despite PoolingMode.NONE off CUDA (as on CPU).
    kernel_overrides={"sequence/dense": "torchrec_ascend.kernels.dense:SequenceDenseEmbedding"},
    process_group_classes=("torch_npu._C._distributed_c10d:ProcessGroupHCCL",),
    installed_with=(
        "torchrec-ascend[npu] (torch-npu "
        + " / ".join(s.torch_npu for s in STACKS)
        + " for torch "
        + " / ".join(s.torch for s in STACKS)
        + ") and a CANN toolkit"
    ),
)

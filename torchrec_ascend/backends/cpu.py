"""The CPU backend: gloo collectives, fbgemm's CPU TBE, no streams. Everything here is built and tested on it."""

from __future__ import annotations

from torchrec_ascend.backends.profile import DeviceProfile, PlannerSpec, TbeSpec

# TorchRec's planner constants (planner/constants.py): DDR bandwidth 51 GiB/s, expressed in bytes/ms.
_DDR_BYTES_PER_MS = 51 * 1024**3 / 1000

CPU = DeviceProfile(
    name="cpu",
    device_type="cpu",
    description="CPU with gloo collectives (always available)",
    collective_backend="gloo",
    priority=0,
    detect=lambda: True,
    # The CPU TBE, block_bucketize_sparse_features and gloo's reduce_scatter/all_gather/all_to_all all work: the
    # stock allow-list refusing row-wise sharding on CPU is policy, not capability.
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
    # fbgemm's CPU TBE fuses the first three; ADAM and PARTIAL_ROWWISE_ADAM ("not supported in CPU mode" there) run
    # torchrec_ascend.kernels.fused_optimizers. EMAINPLACE_ROWWISE_ADAGRAD runs in fbgemm's CPU TBE too but is refused:
    # nothing here has checked its updates against an oracle.
    fused_optimizers=("EXACT_SGD", "EXACT_ADAGRAD", "EXACT_ROWWISE_ADAGRAD", "ADAM", "PARTIAL_ROWWISE_ADAM"),
    # BF16 weights (FP32 state): fbgemm has no BF16 CPU lookup, so torchrec_ascend.kernels.fused_optimizers trains them.
    weight_dtypes=("FP32", "FP16", "BF16"),
    tbe=TbeSpec(location="HOST", compute_device="CPU"),
    # key_value keeps its device cache in host memory here: half of DDR bandwidth (cache plus host-store traffic).
    planner=PlannerSpec(kernel_bandwidths={"key_value": _DDR_BYTES_PER_MS / 2}),
    # fbgemm's CPU dense TBE ignores PoolingMode.NONE, so EmbeddingCollection + data_parallel needs our kernel.
    kernel_overrides={"sequence/dense": "torchrec_ascend.kernels.dense:SequenceDenseEmbedding"},
    process_group_classes=("torch._C._distributed_c10d:ProcessGroupGloo",),
)

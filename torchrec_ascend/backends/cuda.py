"""The CUDA backend: a thin binding (TorchRec supports CUDA natively; we add hash tables, KEY_VALUE, policies)."""

from __future__ import annotations

import importlib

from torchrec_ascend.backends.profile import DeviceProfile, StreamSpec, TbeSpec


def _cuda_present() -> bool:
    torch = importlib.import_module("torch")
    return bool(torch.cuda.is_available())


CUDA = DeviceProfile(
    name="cuda",
    device_type="cuda",
    description="NVIDIA GPU with NCCL collectives",
    collective_backend="nccl",
    priority=10,
    detect=_cuda_present,
    sharding_types=(
        "data_parallel",
        "table_wise",
        "column_wise",
        "table_column_wise",
        "row_wise",
        "table_row_wise",
        "grid_shard",
    ),
    compute_kernels=("fused", "fused_uvm", "fused_uvm_caching", "key_value"),
    fused_optimizers=(
        "EXACT_SGD",
        "EXACT_ADAGRAD",
        "EXACT_ROWWISE_ADAGRAD",
        "EMAINPLACE_ROWWISE_ADAGRAD",
        "ADAM",
        "PARTIAL_ROWWISE_ADAM",
        "LAMB",
        "PARTIAL_ROWWISE_LAMB",
        "LARS_SGD",
    ),
    tbe=TbeSpec(location="DEVICE", compute_device="CUDA"),
    # TorchRec creates CUDA streams itself; listed so the generic H4 code treats every streamed device alike.
    streams=StreamSpec(
        device_module="torch.cuda",
        priorities={"memcpy": 0, "data_dist": -1, "prefetch": 0, "emb_lookup": 0},
        managed_by_torchrec=True,
    ),
    process_group_classes=("torch._C._distributed_c10d:ProcessGroupNCCL",),
    installed_with="fbgemm-gpu (CUDA build)",
)

"""STAND-IN for ``torch_npu``, for tests only: the device registration torchrec-ascend relies on, no device.

Like the real package it renames PrivateUse1 to ``"npu"`` and registers ``torch.npu`` (streams, events, device
count). No kernel, allocator or collective exists: a tensor cannot be created on this "npu".
"""

from __future__ import annotations

import os

import torch

STANDIN = True

_failure = os.environ.get("TORCH_NPU_STANDIN_IMPORT_ERROR")
if _failure:  # what a torch_npu without its CANN runtime libraries does
    raise ImportError(_failure)

from torch_npu import npu  # noqa: E402  (after the failure switch, as the real import order is)
from torch_npu._C import _distributed_c10d  # noqa: E402,F401  (after the switch; torch_npu exposes it)

torch.utils.rename_privateuse1_backend("npu")
torch._register_device_module("npu", npu)

"""Where a suite script's rank runs, read from the environment the suite sets: stock-only, torch imported lazily.

The suite (``launch.script_env``) sets :data:`DEVICE_ENV` (the ``torch.device`` type) and :data:`BACKEND_ENV` (the
collective backend) from the device's backend profile; unset, they mean the CPU with gloo. This module imports
nothing of torchrec_ascend, so the stock scripts beside it use it too (run as scripts, they import it as a sibling
module: this folder is their ``sys.path[0]``).

Example::

    dist.init_process_group(process_group_backend())
    model = DistributedModelParallel(module, device=script_device(), ...)
"""

from __future__ import annotations

import os
from typing import Any

#: ``torch.device`` type the scripts place models and batches on (default ``cpu``).
DEVICE_ENV = "TORCHREC_ASCEND_CONFORMANCE_DEVICE"
#: ``torch.distributed`` backend the scripts initialise their process group with (default ``gloo``).
BACKEND_ENV = "TORCHREC_ASCEND_CONFORMANCE_BACKEND"
DEFAULT_DEVICE, DEFAULT_BACKEND = "cpu", "gloo"


def process_group_backend() -> str:
    """The collective backend a script should pass to ``init_process_group`` (``gloo`` unless the suite says).

    Example::

        dist.init_process_group(process_group_backend(), timeout=datetime.timedelta(seconds=120))
    """
    return os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND


def script_device() -> Any:
    """The ``torch.device`` a script's rank should use: its local accelerator index, or the CPU.

    Returns:
        torch.device: ``cpu``, or ``<type>:<LOCAL_RANK>`` for an accelerator (torchrun sets ``LOCAL_RANK``).

    Example::

        device = script_device()
        model = DistributedModelParallel(module, device=device, ...)
    """
    import torch  # the launcher, which re-exports this, stays importable without torch

    device_type = os.environ.get(DEVICE_ENV) or DEFAULT_DEVICE
    if device_type == DEFAULT_DEVICE:
        return torch.device(device_type)
    return torch.device(device_type, int(os.environ.get("LOCAL_RANK", "0")))

"""Every copy between the host and a compute kernel's device: the kernels cross only here.

Where the work happens: a hash kernel's pool (the TBE's weights and optimizer state) lives on the kernel's device;
the slot tables (ID maps, policies, counters) and KEY_VALUE's host and disk tiers live on the host by design. So a
batch's IDs cross once each way, explicitly and batched, never per ID. Per training step and hash kernel, with the
tables on an accelerator (the emulated NPU's tests and the conformance suite's ``TRANSFER_BUDGET`` count them):

* the ID mapper (:mod:`.id_mapper`): one device-to-host copy of the batch's IDs (blocking: the step's one host sync
  for ID mapping; the negative-ID check runs on that host copy, never on the device) and one host-to-device copy of
  the batch's rows (the mapped slots);
* the pool (:mod:`.pool`), per table that received new rows: two host-to-device copies, their slots and their
  initial values (KEY_VALUE: the rows read back from the host tier); per table that evicted rows (KEY_VALUE): one
  host-to-device copy of their slots and one device-to-host copy of their packed rows (blocking).

A variable-batch (VBE) lookup adds stock fbgemm's own metadata copies (3 host-to-device) and, on a TBE that cannot
write TorchRec's shared output (the CPU's, the emulator's), one host-to-device copy of the block sizes
(``fused.place_vbe_output``; TorchRec's offsets stay on the device).

Under a pipeline that prefetches, the same copies happen in the prefetch, on the pipeline's host thread, and the
lookup reuses its rows. Checkpoints (the pool's export and restore) and KEY_VALUE evaluation from the tiers copy
between batches or per evaluation batch, through the same two functions. On the CPU every copy is a no-op.

Example::

    on_host = to_host(features.values())          # blocking: the host reads it next
    rows = to_device(host_slots, weights.device)  # queued behind the device's work
"""

from __future__ import annotations

from typing import Union

import torch


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the host: one blocking device-to-host copy (the host reads the result), none if it is there."""
    return tensor.to("cpu")


def to_device(tensor: torch.Tensor, device: Union[torch.device, str]) -> torch.Tensor:
    """``tensor`` on ``device``: one host-to-device copy queued without waiting, none if it is there already."""
    return tensor.to(device, non_blocking=True)

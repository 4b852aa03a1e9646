"""Test-only plugin that breaks one kernel on import, so the conformance suite's tests can show it fails.

It is never installed: ``test_conformance_teeth.py`` writes a throwaway distribution whose ``torchrec_ascend``
entry point names this module, and puts it on ``PYTHONPATH`` for one ``torchrec-ascend conformance`` run. The
plugin manager imports it in every process of that run (before TorchRec's first module loads), and
``TORCHREC_ASCEND_TEST_FAULT`` picks the fault:

* ``bucketize_off_by_one``: row-wise bucketization uses blocks one row too large, so each block's last ID lands on
  the wrong rank (and row).
* ``drop_update``: the second training forward of every fused TBE is cut off from autograd, so that step's fused
  optimizer update never happens.
"""

from __future__ import annotations

import os
from typing import Any

import torch

FAULT_ENV = "TORCHREC_ASCEND_TEST_FAULT"


def _bucketize_off_by_one() -> None:
    import fbgemm_gpu  # noqa: F401  (registers the fbgemm ops)

    original = torch.ops.fbgemm.block_bucketize_sparse_features

    def off_by_one(*args: Any, **kwargs: Any) -> Any:
        kwargs["block_sizes"] = kwargs["block_sizes"] + 1
        return original(*args, **kwargs)

    torch.ops.fbgemm.block_bucketize_sparse_features = off_by_one


def _drop_update() -> None:
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen

    original = SplitTableBatchedEmbeddingBagsCodegen.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if not (self.training and torch.is_grad_enabled()):
            return out
        self.fault_calls = getattr(self, "fault_calls", 0) + 1
        return out.detach().requires_grad_() if self.fault_calls == 2 else out

    SplitTableBatchedEmbeddingBagsCodegen.forward = forward


FAULTS = {"bucketize_off_by_one": _bucketize_off_by_one, "drop_update": _drop_update}
FAULTS[os.environ[FAULT_ENV]]()

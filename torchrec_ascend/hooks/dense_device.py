"""H2: TorchRec's dense (data_parallel) kernels keep their tables on a PrivateUse1 device (the NPU).

``BatchedDenseEmbeddingBag`` (and ``BatchedDenseEmbedding``) builds fbgemm's dense TBE with ``use_cpu`` whenever CUDA
(or MTIA) is absent, whatever device the kernel is built for: on an NPU the replicated table stays on the host, and
DDP over the NPU's process group then fails ("No backend type associated with device type cpu"). fbgemm's dense TBE
cannot be built for a PrivateUse1 device directly (without ``use_cpu`` it asks torch.cuda for its device), so the
patched constructor lets the stock one build it on the host, moves it to the kernel's device (its ``feature_dims``
stays on the host, where fbgemm keeps it) and rebuilds the per-table parameter views on the moved weights, before any
subclass (our hash dense kernels) takes its own views. Other devices keep the stock constructor's result.

``BatchedDenseEmbedding`` (EmbeddingCollection + data_parallel) gets the same move (h2.dense_sequence_device), but
its stock lookup is fbgemm's dense TBE, which pools despite ``PoolingMode.NONE`` off CUDA: the npu profile replaces
that kernel with :class:`~torchrec_ascend.kernels.dense.SequenceDenseEmbedding` (as the CPU profile does), whose
constructor is the patched one, so its table lands on the device too.

Example::

    kernel = BatchedDenseEmbeddingBag(config, pg, device=torch.device("npu"))
    kernel.emb_module.weights.device   # device(type='npu', index=0)
"""

from __future__ import annotations

from typing import Any, Callable

from torchrec_ascend.injection.patch import Patch
from torchrec_ascend.versions import TORCHREC

_KERNELS = "torchrec.distributed.batched_embedding_kernel"


def on_privateuse1(device: Any) -> bool:
    """Whether ``device`` is the PrivateUse1 device (the stock dense kernel would put its table on the host).

    Example::

        on_privateuse1(torch.device("npu"))   # True with torch_npu (or the emulated npu) loaded
    """
    import torch

    return device is not None and device.type == torch._C._get_privateuse1_backend_name()


def move_dense_table(kernel: Any, device: Any) -> None:
    """Move a stock dense kernel's TBE to ``device`` and rebuild its per-table parameter views there."""
    from torchrec.distributed.batched_embedding_kernel import _gen_named_parameters_by_table_dense

    emb = kernel._emb_module
    feature_dims = emb.feature_dims
    emb.to(device)
    emb.feature_dims = feature_dims
    kernel._param_per_table = dict(
        _gen_named_parameters_by_table_dense(emb, kernel.table_name_to_count.copy(), kernel._config)
    )


def _init(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, config: Any, pg: Any = None, device: Any = None, *args: Any, **kwargs: Any) -> None:
        original(self, config, pg, device, *args, **kwargs)
        if on_privateuse1(device):
            move_dense_table(self, device)

    return __init__


PATCHES = [
    Patch.wrap(
        name="h2.dense_pooled_device",
        target=f"{_KERNELS}:BatchedDenseEmbeddingBag.__init__",
        requires=TORCHREC,
        reason="the stock dense kernel keeps its table on the host whenever CUDA is absent (use_cpu), also on NPUs",
        wrapper=_init,
    ),
    Patch.wrap(
        name="h2.dense_sequence_device",
        target=f"{_KERNELS}:BatchedDenseEmbedding.__init__",
        requires=TORCHREC,
        reason="the stock sequence dense kernel keeps its table on the host whenever CUDA is absent, also on NPUs",
        wrapper=_init,
    ),
]

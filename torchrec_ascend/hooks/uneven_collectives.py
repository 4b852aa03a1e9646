"""H5b: collectives with uneven splits, for process groups that only gather equal sizes (gloo).

TorchRec's pooled row-wise output dist is a reduce-scatter; when the ranks' batch sizes differ (variable batch
size, TorchRec's VBE, or an empty batch on one rank) its splits are uneven and its backward gathers the gradient with
``dist.all_gather`` of tensors of different sizes, which gloo refuses (``ProcessGroupGloo::allgather: invalid tensor
size``). The patch sends the same gradient with ``all_to_all_single`` instead (every rank's full gradient to every
rank, received at the rank's own split), which every collective backend supports with uneven splits and which moves
the same bytes. Equal splits keep TorchRec's own ``all_gather_into_tensor``.

Example::

    # With the plugin active, row_wise / table_row_wise pooled tables train with per-rank batch sizes 4 and 0.
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

from torchrec_ascend.hooks.versions import TORCHREC
from torchrec_ascend.injection.patch import Patch


def _uneven_backward(original: Callable[..., Tuple[Any, ...]]) -> Callable[..., Tuple[Any, ...]]:
    def backward(ctx: Any, grad_output: Any) -> Tuple[Any, ...]:
        import torch.distributed as dist

        myreq = ctx.myreq
        rsi = myreq.rsi
        if rsi.equal_splits:
            return original(ctx, grad_output)
        if rsi.codecs is not None:
            grad_output = rsi.codecs.backward.encode(grad_output)
        grad_output = grad_output.contiguous()
        grad_input = grad_output.new_empty(rsi.total_input_size)
        world = dist.get_world_size(ctx.pg)
        myreq.req = dist.all_to_all_single(
            grad_input,
            grad_output.repeat((world,) + (1,) * (grad_output.dim() - 1)),
            output_split_sizes=list(rsi.input_splits),
            input_split_sizes=[grad_output.size(0)] * world,
            group=ctx.pg,
            async_op=True,
        )
        myreq.tensor = grad_input
        return (None, None, myreq.dummy_tensor)

    return backward


PATCHES = [
    Patch.wrap(
        name="h5.reduce_scatter_v_backward",
        target="torchrec.distributed.comm_ops:ReduceScatterV_Wait.backward",
        requires=TORCHREC,
        reason="the backward of an uneven reduce-scatter (per-rank batch sizes differ) all-gathers uneven tensors, "
        "which gloo refuses; all_to_all_single carries the same data on every backend",
        wrapper=_uneven_backward,
    ),
]

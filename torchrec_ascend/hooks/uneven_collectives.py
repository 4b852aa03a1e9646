"""H5b: uneven per-rank batches: collectives with uneven splits (gloo), and an empty batch on one rank.

TorchRec's pooled row-wise output dist is a reduce-scatter; when the ranks' batch sizes differ (variable batch
size, TorchRec's VBE, or an empty batch on one rank) its splits are uneven and its backward gathers the gradient with
``dist.all_gather`` of tensors of different sizes, which gloo refuses (``ProcessGroupGloo::allgather: invalid tensor
size``). The patch sends the same gradient with ``all_to_all_single`` instead (every rank's full gradient to every
rank, received at the rank's own split), which every collective backend supports with uneven splits and which moves
the same bytes. Equal splits keep TorchRec's own ``all_gather_into_tensor``.

An EmbeddingCollection whose batch is empty on one rank fails in stock ``construct_jagged_tensors``
(``lengths.view(-1, stride)`` with stride 0, "cannot reshape tensor of 0 elements"), on every sharding type and
with or without the plugin, and the other ranks then wait forever in the backward all-to-all. The patched function
returns an empty JaggedTensor per embedding, still a view of the lookup output, so the rank joins the backward.

Example::

    # With the plugin active, row_wise / table_row_wise pooled tables train with per-rank batch sizes 4 and 0.
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

from torchrec_ascend.injection.patch import Patch
from torchrec_ascend.versions import TORCHREC


def scatter_uneven_gradient(ctx: Any, grad_output: Any) -> Tuple[Any, ...]:
    """The backward of an uneven ``ReduceScatterV``: every rank's full gradient to every rank by
    ``all_to_all_single``, received at the rank's own split (what the stock backward's ``all_gather`` does, on any
    backend)."""
    import torch.distributed as dist

    myreq = ctx.myreq
    rsi = myreq.rsi
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


def _uneven_backward(original: Callable[..., Tuple[Any, ...]]) -> Callable[..., Tuple[Any, ...]]:
    def backward(ctx: Any, grad_output: Any) -> Tuple[Any, ...]:
        if ctx.myreq.rsi.equal_splits:
            return original(ctx, grad_output)
        return scatter_uneven_gradient(ctx, grad_output)

    return backward


def _empty_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    import inspect

    signature = inspect.signature(original)

    def construct_jagged_tensors(*args: Any, **kwargs: Any) -> Any:
        from torchrec.sparse.jagged_tensor import JaggedTensor

        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        a = call.arguments
        features = a["original_features"] if a["original_features"] is not None else a["features"]
        if a["seq_vbe_ctx"] is not None or features.stride() != 0:
            return original(*call.args, **call.kwargs)
        empty = a["embeddings"][:0]  # keeps the autograd path to the output dist
        values = features.values()[:0] if a["need_indices"] else None
        return {
            key: JaggedTensor(values=empty, lengths=features.lengths()[:0], weights=values)
            for key in a["embedding_names"]
        }

    return construct_jagged_tensors


PATCHES = [
    Patch.wrap(
        name="h5.reduce_scatter_v_backward",
        target="torchrec.distributed.comm_ops:ReduceScatterV_Wait.backward",
        requires=TORCHREC,
        reason="the backward of an uneven reduce-scatter (per-rank batch sizes differ) all-gathers uneven tensors, "
        "which gloo refuses; all_to_all_single carries the same data on every backend",
        wrapper=_uneven_backward,
    ),
    Patch.wrap(
        name="h5.empty_sequence_batch",
        target="torchrec.distributed.embedding:construct_jagged_tensors",
        requires=TORCHREC,
        reason="an EmbeddingCollection batch of size 0 on one rank fails in construct_jagged_tensors (view with "
        "stride 0) and leaves the other ranks waiting in the backward all-to-all",
        wrapper=_empty_batch,
    ),
]

"""The KEY_VALUE eval path's variable-batch output layout equals fbgemm's TBE output on the same pooled rows."""

from __future__ import annotations

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from torchrec_ascend.kernels.key_value.kernel import vbe_layout


def test_vbe_layout_matches_fbgemm_and_fills_a_shared_output() -> None:
    dims, samples = [4, 8], [[2, 1], [1, 3]]  # per feature, per rank
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(10, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for d in dims], pooling_mode=PoolingMode.SUM
    )
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 3, (sum(map(sum, samples)),), generator=gen)
    indices = torch.randint(0, 10, (int(lengths.sum()),), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    expected = tbe(indices, offsets, batch_size_per_feature_per_rank=samples).detach()
    # Per feature, its pooled rows (samples in rank order), from the TBE's own weights
    weights = tbe.split_embedding_weights()
    table_of = [0] * sum(samples[0]) + [1] * sum(samples[1])
    per_sample = [weights[t][indices[offsets[j]:offsets[j + 1]]].sum(0) for j, t in enumerate(table_of)]
    pooled = [torch.stack(per_sample[:3]), torch.stack(per_sample[3:])]
    torch.testing.assert_close(vbe_layout(pooled, samples, None, None), expected, rtol=0, atol=1e-6)
    # TorchRec's preallocated output of several kernels: this kernel's blocks at offsets[rank][feature]
    shared = torch.full((expected.numel() + 5,), -1.0)
    starts = torch.tensor([[5, 5 + 8], [5 + 8 + 8, 5 + 8 + 8 + 4]])  # rank-major: r0 f0 (2x4), r0 f1 (1x8), ...
    out = vbe_layout(pooled, samples, shared, starts)
    assert bool((out[:5] == -1).all()) and bool((shared == -1).all()), "placed out of place"
    torch.testing.assert_close(out[5:], expected, rtol=0, atol=1e-6)

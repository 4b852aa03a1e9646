"""BF16 weights with FP32 optimizer state on the CPU (``torchrec_ascend.kernels.fused_optimizers``).

fbgemm's CPU TBE has no BF16 lookup, so every fused optimizer of a BF16 table runs in our torch ops. The oracles
share nothing with them: fbgemm's own FP32 kernels (EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD) and
``TouchedRowsAdam`` (torch.optim.AdamW on the touched rows) with ``embedding_bag`` for the lookup, their weights
rounded to BF16 (to nearest) after every step, as a BF16 table stores them. Stochastic rounding (fbgemm's default) is
checked for what it promises: a value rounds to one of its two BF16 neighbours, up with the probability of the
dropped fraction, and the same batch rounds the same way whatever slots its rows have.
"""

from __future__ import annotations

import tempfile
from typing import Any, Dict, List

import pytest
import torch
import torch.distributed as dist
import torchrec
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.types import DataType

from tbe_batches import oracle_lookup, random_batch
from torchrec_ascend import get_default_hybrid_sharders
from torchrec_ascend.conformance_tests.stock.sharding_matrix import TouchedRowsAdam
from torchrec_ascend.kernels.fused_optimizers import install_on_tbe, rounding_noise, stochastic_bf16
from torchrec_ascend.kernels.pool import RowCodec
from torchrec_ascend.kernels.walk import sharded_kernels

LR, EPS, BETAS, DECAY = 0.05, 0.01, (0.8, 0.95), 0.01
FBGEMM_CPU = ["EXACT_SGD", "EXACT_ADAGRAD", "EXACT_ROWWISE_ADAGRAD"]


def make_tbe(specs: List[Any], features: List[int], name: str, pooling: PoolingMode, precision: SparseType,
             stochastic: bool = False) -> Any:
    adam = name not in FBGEMM_CPU
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for rows, dim in specs], feature_table_map=features,
        optimizer=EmbOptimType.EXACT_SGD if adam else EmbOptimType[name], learning_rate=LR, eps=EPS,
        beta1=BETAS[0], beta2=BETAS[1], weight_decay=DECAY if adam else 0.0, pooling_mode=pooling,
        weights_precision=precision,
        stochastic_rounding=stochastic, device="cpu")


def bf16_tbe(specs: List[Any], features: List[int], name: str, pooling: PoolingMode, **kwargs: Any) -> Any:
    module = make_tbe(specs, features, name, pooling, SparseType.BF16, **kwargs)
    install_on_tbe(module, name)
    return module


def ulps(ours: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest difference in BF16 steps of the expected value (BF16 keeps 8 significant bits)."""
    step = torch.exp2(torch.floor(torch.log2(expected.abs().clamp(min=1e-30))) - 7)
    return float(((ours.float() - expected) / step).abs().max())


@settings(deadline=None, max_examples=30)
@given(
    name=st.sampled_from(FBGEMM_CPU + ["ADAM", "PARTIAL_ROWWISE_ADAM"]),
    pooling=st.sampled_from([PoolingMode.SUM, PoolingMode.MEAN, PoolingMode.NONE]),
    dims=st.sampled_from([(4, 4), (4, 8)]),
    weighted=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_bf16_tables_train_as_the_fp32_oracle_rounded_to_bf16(name: str, pooling: PoolingMode, dims: Any,
                                                              weighted: bool, seed: int) -> None:
    """Several steps, two tables (three features, one shared), duplicate IDs, empty bags, rows absent from steps."""
    dims = (4, 4) if pooling == PoolingMode.NONE else dims  # a sequence TBE has one dim
    weighted = weighted and pooling == PoolingMode.SUM
    gen = torch.Generator().manual_seed(seed)
    specs, features, batch = [(7, dims[0]), (9, dims[1])], [0, 1, 1], 3
    module = bf16_tbe(specs, features, name, pooling)
    start = [w.float() for w in module.split_embedding_weights()]
    if name in FBGEMM_CPU:
        oracle_tbe = make_tbe(specs, features, name, pooling, SparseType.FP32)
        for t, w in enumerate(oracle_tbe.split_embedding_weights()):
            w.copy_(start[t])
        reference = oracle_tbe.split_embedding_weights()
    else:
        reference = [torch.nn.Parameter(w.clone()) for w in start]
        oracle = TouchedRowsAdam(reference, lr=LR, eps=EPS, betas=BETAS, weight_decay=DECAY,
                                 rowwise=name == "PARTIAL_ROWWISE_ADAM")
    for _ in range(4):
        steps = random_batch(gen, specs, features, batch)
        out = module(steps.indices, steps.offsets, steps.per_sample_weights(weighted))
        assert out.dtype == torch.float32  # fbgemm's default output_dtype, as TorchRec gives it
        if name in FBGEMM_CPU:
            expected = oracle_tbe(steps.indices, steps.offsets, steps.per_sample_weights(weighted))
        else:
            expected = oracle_lookup(reference, features, steps, weighted, pooling)
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
        upstream = torch.randn(out.shape, generator=gen)
        (out * upstream).sum().backward()
        (expected * upstream).sum().backward()
        if name not in FBGEMM_CPU:
            oracle.step()
            oracle.zero_grad()
        with torch.no_grad():
            for t, ref in enumerate(reference):
                # The same FP32 formula in another order may land on the other side of a rounding boundary: at
                # most 1 BF16 step. Then the oracle goes on from our values, so every step is checked on its own.
                weights = module.split_embedding_weights()[t]
                assert weights.dtype == torch.bfloat16
                assert ulps(weights, ref.bfloat16().float()) <= 1.0
                ref.copy_(weights.float())
    if name in FBGEMM_CPU[1:]:
        states = zip(module.split_optimizer_states(), oracle_tbe.split_optimizer_states())
    elif name != "EXACT_SGD":
        rowwise = name == "PARTIAL_ROWWISE_ADAM"
        states = [((s["exp_avg"], s["exp_avg_sq"]), (oracle.state[r]["exp_avg"],
                                                     oracle.state[r]["exp_avg_sq"][:, 0] if rowwise
                                                     else oracle.state[r]["exp_avg_sq"]))
                  for s, r in zip(module.get_optimizer_state(), reference)]
    for ours, theirs in states if name != "EXACT_SGD" else []:
        for mine, expected in zip(ours, theirs):
            assert mine.dtype == torch.float32  # optimizer state stays FP32
            torch.testing.assert_close(mine, expected.reshape(mine.shape), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("pooling", [PoolingMode.SUM, PoolingMode.MEAN], ids=["sum", "mean"])
def test_a_variable_batch_looks_up_as_fbgemm_does(pooling: PoolingMode) -> None:
    """Per feature a batch size per rank (VBE): the same flat, rank-major output as fbgemm's FP32 kernel."""
    specs, features = [(10, 4), (10, 8)], [0, 1]
    ours = bf16_tbe(specs, features, "EXACT_ROWWISE_ADAGRAD", pooling)
    fbgemm = make_tbe(specs, features, "EXACT_ROWWISE_ADAGRAD", pooling, SparseType.FP32)
    for t, w in enumerate(fbgemm.split_embedding_weights()):
        w.copy_(ours.split_embedding_weights()[t].float())
    sizes, offsets = [[1, 2], [2, 1]], torch.tensor([0, 2, 3, 3, 5, 6, 9])
    indices = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9])
    with torch.no_grad():
        torch.testing.assert_close(ours(indices, offsets, batch_size_per_feature_per_rank=sizes),
                                   fbgemm(indices, offsets, batch_size_per_feature_per_rank=sizes))


@settings(deadline=None, max_examples=50)
@given(value=st.floats(min_value=-1e30, max_value=1e30, allow_nan=False, allow_subnormal=False))
def test_stochastic_rounding_lands_on_a_neighbour_up_with_the_dropped_fraction(value: float) -> None:
    x = torch.tensor(value, dtype=torch.float32)
    down = torch.tensor(value, dtype=torch.float32).view(torch.int32) & -65536
    low, high = down.view(torch.float32).abs(), (down + 65536).view(torch.float32).abs()
    rows = 4096
    rounded = stochastic_bf16(x.expand(rows, 4), rounding_noise(torch.arange(rows), 4, torch.tensor([7]))).float()
    assert set(rounded.abs().unique().tolist()) <= {float(low), float(high)}
    if high > low:
        share_up = float((rounded.abs() == high).float().mean())
        fraction = float((x.abs() - low) / (high - low))
        assert abs(share_up - fraction) < 0.03  # 16384 draws: 5 standard deviations at most ~0.02


def test_stochastic_rounding_keeps_updates_nearest_rounding_drops() -> None:
    """SGD steps below half a BF16 step: to nearest the weights never move; stochastically they move as in FP32."""
    moved = {}
    for stochastic in (False, True):
        module = bf16_tbe([(512, 8)], [0], "EXACT_SGD", PoolingMode.SUM, stochastic=stochastic)
        weights = module.split_embedding_weights()[0]
        weights.fill_(1.0)
        for _ in range(8):  # each step: -LR * 2 ** -10 on every row, a sixteenth of a BF16 step at 1.0
            module(torch.arange(512), torch.arange(513)).sum().mul(2 ** -10).backward()
        moved[stochastic] = float(1.0 - weights.float().mean())
    assert moved[False] == 0.0
    assert abs(moved[True] - 8 * LR * 2 ** -10) < 0.1 * 8 * LR * 2 ** -10


def test_duplicates_and_other_slots_round_alike() -> None:
    """The noise follows a row's first occurrence in the batch, not its slot: a batch whose rows sit in other slots
    (a KEY_VALUE cache against FUSED) ends with the same values, and a row's duplicates agree."""
    results = []
    for permutation in (torch.arange(16), torch.randperm(16, generator=torch.Generator().manual_seed(3))):
        module = bf16_tbe([(16, 8)], [0], "EXACT_ROWWISE_ADAGRAD", PoolingMode.SUM, stochastic=True)
        weights = module.split_embedding_weights()[0]
        start = torch.linspace(-1, 1, 16 * 8).view(16, 8).bfloat16()
        weights[permutation] = start
        ids = torch.tensor([3, 5, 3, 9, 9, 9, 1])
        for _ in range(3):
            out = module(permutation[ids], torch.tensor([0, 3, 7]))
            (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        results.append(weights[permutation].clone())
    assert torch.equal(results[0], results[1])


@settings(deadline=None, max_examples=25)
@given(cols=st.integers(1, 9), states=st.integers(0, 9), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       seed=st.integers(0, 2**16))
def test_a_16_bit_row_is_stored_in_its_own_bits_and_comes_back_exactly(cols: int, states: int, dtype: torch.dtype,
                                                                       seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randn(5, cols + states, generator=gen)
    packed[:, :cols] = packed[:, :cols].to(dtype).float()  # the weights a 16-bit table holds
    codec = RowCodec(cols, states, dtype)
    stored = codec.encode(packed)
    assert stored.dtype == torch.int16 and stored.shape == (5, cols + 2 * states)
    assert torch.equal(codec.decode(stored), packed)
    assert torch.equal(RowCodec(cols, states, torch.float32).encode(packed), packed)  # FP32 rows as they are


def key_value_bytes_per_row(data_type: DataType, optimizer: type, directory: str) -> Dict[str, int]:
    """Per tier, the bytes a row of a dim-128 KEY_VALUE table takes, read from the kernel's own buffers."""
    ebc = torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
        name="t", embedding_dim=128, num_embeddings=1024, feature_names=["f"], data_type=data_type)])
    apply_optimizer_in_backward(optimizer, ebc.parameters(), {"lr": 0.01})
    constraints = {"t": ParameterConstraints(
        sharding_types=["table_wise"], compute_kernels=["key_value"], cache_params=CacheParams(load_factor=0.1),
        key_value_params=KeyValueParams(l2_cache_size=1e-6, ssd_storage_directory=directory))}
    sharders = get_default_hybrid_sharders()
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                    constraints=constraints).plan(ebc, sharders)
    dmp = DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   device=torch.device("cpu"), plan=plan, sharders=sharders)
    kernel = next(iter(sharded_kernels(dmp)))
    pool = kernel.pool
    weights = pool._tbe.weights(0)
    states = sum(s.element_size() * s[0].numel() for s in pool._tbe.states(0))
    store = kernel.row_tier.stores[0]
    assert store.spill is not None
    return {"device": weights.element_size() * weights.shape[1] + states, "host": store.row_bytes,
            "disk": store.spill.width * store.spill.dtype.itemsize}


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize("optimizer, fp32, bf16", [(torchrec.optim.RowWiseAdagrad, 516, 260),
                                                   (torch.optim.Adam, 1536, 1280)], ids=["rowwise_adagrad", "adam"])
def test_a_bf16_row_takes_half_the_weight_bytes_on_every_tier(optimizer: type, fp32: int, bf16: int) -> None:
    """Dim 128: weights 512 B in FP32, 256 B in BF16; the FP32 state (4 B row-wise, 1024 B Adam) is unchanged."""
    with tempfile.TemporaryDirectory() as directory:
        assert key_value_bytes_per_row(DataType.FP32, optimizer, directory) == dict.fromkeys(
            ("device", "host", "disk"), fp32)
        assert key_value_bytes_per_row(DataType.BF16, optimizer, directory) == dict.fromkeys(
            ("device", "host", "disk"), bf16)

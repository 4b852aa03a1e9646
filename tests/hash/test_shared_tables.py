"""A hash table read by several features: a step is a batch, in the unsharded module as in the sharded kernels.

Oracle: a plain-Python model of an LRU table (dict ID -> row, deterministic initial rows, SGD written out) that
maps every feature's IDs of a batch at once. Ties between IDs last used in the same batch are the policy's to
break, so the model takes the victims from the module and checks that they obey the LRU contract: none of the
batch's IDs, exactly as many as the batch needs, and none used more recently than an ID kept.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest
import torch
import torchrec
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, HashEmbeddingConfig
from torchrec_ascend.errors import CapacityError
from torchrec_ascend.native import reference

CAPACITY, DIM, LR, SEED = 8, 4, 0.5, 3
INIT = (-0.25, 0.25)


def make(kind: str) -> torch.nn.Module:
    common = dict(name="t", embedding_dim=DIM, num_embeddings=CAPACITY, feature_names=["f", "g"],
                  overflow="evict", eviction_policy="lru", init_seed=SEED, weight_init_min=INIT[0],
                  weight_init_max=INIT[1])
    if kind == "ec":
        return torchrec.EmbeddingCollection(tables=[HashEmbeddingConfig(**common)])
    return torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(**common)])


def batches(seed: int, steps: int) -> List[Tuple[List[List[int]], List[List[int]]]]:
    """Per step, per feature (f, g): 2 samples of IDs; at most CAPACITY distinct IDs per step, 20 overall."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        pool = torch.randperm(20, generator=gen)[:CAPACITY] * 1_000_003
        out.append(tuple(
            [pool[torch.randint(0, CAPACITY, (int(torch.randint(0, 4, (1,), generator=gen)),), generator=gen)]
             .tolist() for _ in range(2)]
            for _ in range(2)
        ))
    return out


def kjt(step: Tuple[List[List[int]], List[List[int]]]) -> KeyedJaggedTensor:
    samples = [s for feature in step for s in feature]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f", "g"], values=torch.tensor([i for s in samples for i in s], dtype=torch.int64),
        lengths=torch.tensor([len(s) for s in samples]),
    )


class LruModel:
    """The table as a dict: rows, last-use step, one step per batch."""

    def __init__(self) -> None:
        self.rows: Dict[int, torch.Tensor] = {}
        self.last_used: Dict[int, int] = {}
        self.step = 0

    def map_batch(self, ids: List[int], held_after: set) -> None:
        """Apply a batch's IDs; check the module's victims against the LRU contract; fill new IDs."""
        self.step += 1
        batch = set(ids)
        new = batch - set(self.rows)
        evicted = set(self.rows) - held_after
        kept = set(self.rows) - evicted - batch
        assert not evicted & batch, "an ID of the batch itself was evicted"
        assert len(evicted) == max(0, len(self.rows) + len(new) - CAPACITY), "evicted more (or fewer) than needed"
        if evicted and kept:
            assert max(self.last_used[i] for i in evicted) <= min(self.last_used[i] for i in kept), "not LRU"
        for i in evicted:
            del self.rows[i], self.last_used[i]
        for i in sorted(new):
            self.rows[i] = reference.hash_uniform_init(torch.tensor([i]), SEED, DIM, *INIT)[0]
        for i in batch:
            self.last_used[i] = self.step


def held_ids(module: torch.nn.Module, kind: str) -> set:
    lookup = (module.embeddings if kind == "ec" else module.embedding_bags)["t"]
    return set(lookup.slots.id_map.export()[0].tolist())


@pytest.mark.parametrize("kind", ["ebc", "ec"])
@pytest.mark.parametrize("seed", range(4))
def test_shared_table_evicts_once_per_batch_like_the_python_model(kind: str, seed: int) -> None:
    module = make(kind)
    lookup = (module.embeddings if kind == "ec" else module.embedding_bags)["t"]
    optimizer = torch.optim.SGD(module.parameters(), lr=LR)
    model = LruModel()
    for n, step in enumerate(batches(seed, 30)):
        features = kjt(step)
        out = module(features)
        ids = features.values().tolist()
        model.map_batch(ids, held_ids(module, kind))
        rows = {i: model.rows[i].clone().requires_grad_(True) for i in set(ids)}
        gen = torch.Generator().manual_seed(n)
        if kind == "ec":
            expected = {k: torch.stack([rows[i] for s in feature for i in s]) if any(feature) else torch.zeros(0, DIM)
                        for k, feature in zip("fg", step)}
            got = {k: out[k].values() for k in "fg"}
        else:
            expected = {k: torch.stack([sum((rows[i] for i in s), torch.zeros(DIM)) for s in feature])
                        for k, feature in zip("fg", step)}
            got = out.to_dict()
        upstream = {k: torch.randn(got[k].shape, generator=gen) for k in "fg"}
        loss = sum((got[k] * upstream[k]).sum() for k in "fg")
        ref_loss = sum((expected[k] * upstream[k]).sum() for k in "fg")
        for k in "fg":
            assert torch.allclose(got[k], expected[k], atol=1e-6), (n, k)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rows:
            ref_loss.backward()
            with torch.no_grad():
                for i, row in rows.items():
                    model.rows[i] = row - LR * row.grad if row.grad is not None else row.detach()
    assert lookup.slots.step == 30, "one step per batch, not per feature"
    assert lookup.slots.counters["evicted"] > 10, "the table should have evicted: the case proves nothing"


def test_a_batch_larger_than_the_table_is_refused_not_half_evicted() -> None:
    module = make("ebc")
    module(kjt(([[1, 2]], [[3, 4]])))
    with pytest.raises(CapacityError, match="table 't'"):  # 9 distinct IDs in one batch of an 8-ID table
        module(kjt(([[1, 2, 5, 6, 7]], [[8, 9, 10, 11]])))

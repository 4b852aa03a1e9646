"""Hash tables in stock collections: raw IDs, deterministic rows, state_dict, overflow, admission, eval mode."""

from __future__ import annotations

from typing import Any, List

import pytest
import torch
import torchrec
from hypothesis import given
from hypothesis import strategies as st
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagCollection, HashEmbeddingBagConfig, HashEmbeddingConfig
from torchrec_ascend.errors import CapacityError, ConfigError
from torchrec_ascend.hash.modules import HashEmbedding, HashEmbeddingBag
from torchrec_ascend.native import reference

DIM = 4
INIT = (-0.5, 0.5)


def ebc(capacity: int = 16, **options: object) -> torchrec.EmbeddingBagCollection:
    return torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name="user", embedding_dim=DIM, num_embeddings=capacity, feature_names=["uid"], init_seed=7,
        weight_init_min=INIT[0], weight_init_max=INIT[1], **options)])


def kjt(bags: list) -> KeyedJaggedTensor:
    values = [i for bag in bags for i in bag]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["uid"], values=torch.tensor(values, dtype=torch.int64), lengths=torch.tensor([len(b) for b in bags])
    )


def initial(ids: list) -> torch.Tensor:
    return reference.hash_uniform_init(torch.tensor(ids, dtype=torch.int64), 7, DIM, *INIT)


def test_stock_collections_hold_hash_lookups() -> None:
    assert isinstance(ebc().embedding_bags["user"], HashEmbeddingBag)
    ec = torchrec.EmbeddingCollection(tables=[HashEmbeddingConfig(name="t", embedding_dim=DIM, num_embeddings=8)])
    assert isinstance(ec.embeddings["t"], HashEmbedding)


@given(st.lists(st.lists(st.integers(0, 2**63 - 1), max_size=4), min_size=1, max_size=5))
def test_rows_are_a_function_of_seed_and_id(bags: list) -> None:
    ids = sorted({i for bag in bags for i in bag})
    module = ebc(capacity=len(ids) + 2)
    pooled = module(kjt(bags)).values()
    expected = torch.stack([initial(b).sum(0) if b else torch.zeros(DIM) for b in bags])
    torch.testing.assert_close(pooled, expected, rtol=0, atol=1e-6)


def test_state_dict_round_trips_ids_and_rows() -> None:
    module = ebc()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    for step in range(3):
        optimizer.zero_grad()
        module(kjt([[3, 2**60 + step], [5]])).values().sum().backward()
        optimizer.step()
    restored = ebc()
    restored.load_state_dict(module.state_dict())
    batch = kjt([[3], [2**60 + 1, 5], [99]])
    torch.testing.assert_close(restored(batch).values(), module(batch).values(), rtol=0, atol=0)
    ids, _ = restored.embedding_bags["user"].slots.id_map.export()
    assert sorted(ids.tolist()) == sorted([3, 5, 99, 2**60, 2**60 + 1, 2**60 + 2])


def test_full_table_with_overflow_error_names_the_table() -> None:
    module = ebc(capacity=4)  # 4 IDs fit: the not-admitted vector's row is outside num_embeddings
    module(kjt([[1, 2, 3, 4]]))
    with pytest.raises(CapacityError, match="'user'.*overflow='evict'"):
        module(kjt([[5]]))


def test_evict_frees_least_recently_used_and_counts() -> None:
    module = ebc(capacity=3, overflow="evict", eviction_policy="lru")
    for bag in ([1], [2], [3], [1], [4], [5]):
        module(kjt([bag]))
    slots = module.embedding_bags["user"].slots
    assert slots.stats()["evicted"] == 2
    held = sorted(slots.id_map.export()[0].tolist())
    assert held == [1, 4, 5], "2 and 3 were the least recently used"


def test_negative_id_names_table() -> None:
    with pytest.raises(ValueError, match="'user'.*non-negative"):
        ebc()(kjt([[1, -3]]))


def test_rejected_ids_read_the_not_admitted_vector() -> None:
    module = ebc(admission_policy="count", admission_options={"threshold": 2}, not_admitted_value=0.25)
    first = module(kjt([[11]])).values()
    torch.testing.assert_close(first, torch.full((1, DIM), 0.25))
    module(kjt([[11]]))  # second sighting: admitted
    torch.testing.assert_close(module(kjt([[11]])).values(), initial([11]))
    assert module.embedding_bags["user"].slots.stats()["rejected"] == 1


def test_eval_mode_does_not_insert() -> None:
    module = ebc()
    module(kjt([[1]]))
    module.eval()
    out = module(kjt([[1], [2]])).values()
    torch.testing.assert_close(out, torch.cat([initial([1]), torch.zeros(1, DIM)]))
    assert len(module.embedding_bags["user"].slots) == 1


def test_hash_collection_refuses_plain_tables() -> None:
    plain = torchrec.EmbeddingBagConfig(name="p", embedding_dim=DIM, num_embeddings=4, feature_names=["p"])
    with pytest.raises(ConfigError, match=r"\['p'\] are plain"):
        HashEmbeddingBagCollection(tables=[plain])


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="overflow"):
        HashEmbeddingBagConfig(name="t", embedding_dim=DIM, num_embeddings=8, overflow="drop")
    with pytest.raises(ConfigError, match="lruu"):
        ebc(overflow="evict", eviction_policy="lruu")


def test_cadence_drops_expired_rows_on_its_steps() -> None:
    module = ebc(capacity=16, overflow="evict", eviction_policy="ttl", eviction_options={"ttl_steps": 2},
                 eviction_cadence={"interval": 3})
    slots = module.embedding_bags["user"].slots
    module(kjt([[1, 2]]))  # step 1
    for _ in range(4):  # steps 2-5: only ID 3 is used; at step 3 nothing is stale yet, at step 6 IDs 1, 2 are
        module(kjt([[3]]))
    assert sorted(slots.id_map.export()[0].tolist()) == [1, 2, 3]
    module(kjt([[3]]))  # step 6: a cadence step, IDs 1 and 2 idle for more than 2 steps
    assert sorted(slots.id_map.export()[0].tolist()) == [3]
    assert slots.stats()["evicted"] == 2


@pytest.mark.parametrize("min_residency", [0, 3])
def test_min_residency_protects_new_rows(min_residency: int) -> None:
    module = ebc(capacity=3, overflow="evict", eviction_policy="lru", eviction_cadence={"min_residency": min_residency})
    for bag in ([1], [2], [3], [1, 2]):  # steps 1-4: 3 IDs fill the shard; 3 is now least recently used, and young
        module(kjt([bag]))
    module(kjt([[4]]))  # step 5: one row must go
    held = sorted(module.embedding_bags["user"].slots.id_map.export()[0].tolist())
    if min_residency:
        assert 3 in held and 4 in held, "the young row 3 is protected; a mature one (1 or 2) goes instead"
    else:
        assert held == [1, 2, 4], "plain LRU evicts 3"


@pytest.mark.parametrize("kind", ["ebc", "ec"])
@given(capacity=st.integers(1, 12), order=st.randoms(use_true_random=False))
def test_table_holds_num_embeddings_ids_then_evicts_like_lru(kind: str, capacity: int, order: Any) -> None:
    """num_embeddings IDs fit with nothing evicted or rejected; one more evicts the least recently used (a plain
    Python LRU list is the model), and no ID ever reads another's row."""
    if kind == "ebc":
        module: Any = ebc(capacity=capacity, overflow="evict", eviction_policy="lru")
    else:
        module = torchrec.EmbeddingCollection(tables=[HashEmbeddingConfig(
            name="user", embedding_dim=DIM, num_embeddings=capacity, feature_names=["uid"], init_seed=7,
            weight_init_min=INIT[0], weight_init_max=INIT[1], overflow="evict", eviction_policy="lru")])
    ids = [1_000 + 17 * k for k in range(capacity + 1)]
    order.shuffle(ids)
    lru: List[int] = []
    for step, i in enumerate(ids):  # one ID per step: distinct last uses
        out = module(kjt([[i]]))
        values = out.values() if kind == "ebc" else out["uid"].values()
        torch.testing.assert_close(values, initial([i]), rtol=0, atol=1e-6)
        lru = [j for j in lru if j != i] + [i]
        if len(lru) > capacity:
            lru.pop(0)
        slots = (module.embedding_bags if kind == "ebc" else module.embeddings)["user"].slots
        assert sorted(slots.id_map.export()[0].tolist()) == sorted(lru)
        assert slots.stats()["evicted"] == max(0, step + 1 - capacity) and slots.stats()["rejected"] == 0

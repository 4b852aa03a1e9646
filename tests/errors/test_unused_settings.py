"""Eviction settings a table would ignore are refused, not accepted: an unsharded hash module refuses them at its
first training batch (not at construction: a config built unsharded may be sharded as KEY_VALUE, whose device cache
evicts by them whatever the overflow rule)."""

from __future__ import annotations

import pytest
import torch
import torchrec
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig
from torchrec_ascend.errors import ConfigError


def test_unsharded_module_refuses_eviction_settings_it_would_ignore_at_its_first_training_batch() -> None:
    ebc = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name="user", embedding_dim=4, num_embeddings=8, feature_names=["f"], eviction_cadence={"interval": 5})])
    batch = KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=torch.tensor([3]), lengths=torch.tensor([1]))
    with pytest.raises(ConfigError, match=r"table 'user': eviction_cadence=\{'interval': 5\} would be ignored"):
        ebc(batch)
    ebc.eval()
    ebc(batch)  # evaluation inserts nothing and evicts nothing: nothing is ignored

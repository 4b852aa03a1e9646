"""The HSTU layer: its formula (checked against a position-by-position reference), shapes, and causality."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hstu import HSTUEncoder, HSTULayer


def reference_layer(layer: HSTULayer, x: torch.Tensor) -> torch.Tensor:
    """The layer's formula written out one output position and one head at a time."""
    batch, length, dim = x.shape
    heads, head_dim = layer.num_heads, dim // layer.num_heads
    out = torch.empty_like(x)
    for b in range(batch):
        u, v, q, k = F.silu(layer.uvqk(layer.input_norm(x[b]))).chunk(4, dim=-1)
        for t in range(length):
            attended = torch.zeros(dim)
            for h in range(heads):
                channels = slice(h * head_dim, (h + 1) * head_dim)
                for s in range(t + 1):  # causal: only positions s <= t
                    weight = F.silu(q[t, channels] @ k[s, channels]) / layer.max_seq_len  # no softmax
                    attended[channels] += weight * v[s, channels]
            out[b, t] = x[b, t] + layer.output(layer.attention_norm(attended) * u[t])
    return out


@settings(deadline=None, max_examples=10)
@given(batch=st.integers(1, 3), length=st.integers(1, 6), heads=st.sampled_from([1, 2, 4]), seed=st.integers(0, 99))
def test_layer_matches_reference(batch, length, heads, seed):
    torch.manual_seed(seed)
    layer = HSTULayer(dim=8, num_heads=heads, max_seq_len=6).eval()
    x = torch.randn(batch, length, 8)
    torch.testing.assert_close(layer(x), reference_layer(layer, x), rtol=1e-4, atol=1e-5)


def test_shapes():
    encoder = HSTUEncoder(dim=16, max_seq_len=12, num_layers=2, num_heads=4)
    assert encoder(torch.randn(3, 12, 16)).shape == (3, 12, 16)
    assert encoder(torch.randn(3, 5, 16)).shape == (3, 5, 16)  # shorter than max_seq_len is fine


@settings(deadline=None, max_examples=20)
@given(changed=st.integers(0, 9), seed=st.integers(0, 99))
def test_future_items_do_not_change_earlier_outputs(changed, seed):
    torch.manual_seed(seed)
    encoder = HSTUEncoder(dim=16, max_seq_len=10, num_layers=2, num_heads=2, dropout=0.3).eval()
    items = torch.randn(2, 10, 16)
    edited = items.clone()
    edited[:, changed] = torch.randn(2, 16)
    before, after = encoder(items), encoder(edited)
    torch.testing.assert_close(after[:, :changed], before[:, :changed], rtol=0, atol=0)
    assert not torch.allclose(after[:, changed:], before[:, changed:])  # the edit is visible from there on


def test_bad_configuration_and_input_are_named():
    with pytest.raises(ValueError, match="dim=10 must be a multiple of num_heads=4"):
        HSTULayer(dim=10, num_heads=4, max_seq_len=5)
    with pytest.raises(ValueError, match="sequence length 6 exceeds max_seq_len=5"):
        HSTULayer(dim=8, num_heads=2, max_seq_len=5)(torch.randn(1, 6, 8))
    with pytest.raises(ValueError, match="sequence length 6 exceeds max_seq_len=5"):
        HSTUEncoder(dim=8, max_seq_len=5, num_layers=1, num_heads=2)(torch.randn(1, 6, 8))

"""Dedup of an EmbeddingCollection's IDs before the all-to-all, exact for raw 64-bit IDs.

TorchRec's ``EmbeddingCollectionSharder(use_index_dedup=True)`` sends each table's distinct IDs once per batch and
expands the returned embeddings with reverse indices. Stock finds the distinct IDs with fbgemm's
``jagged_unique_indices``, which linearizes ``ID + sum of the previous tables' num_embeddings``: a hash table's raw
IDs are not bounded by its ``num_embeddings``, so ID 1500 of a 1000-row table would merge with ID 500 of the next
table (and fbgemm has no CPU kernel for it). :func:`dedup_per_table` dedups per table instead, with the same output
layout, so everything downstream of the stock dedup is unchanged.

On an accelerator the dedup runs on the host with the native one-pass unique: per batch, one device-to-host copy of
the IDs (blocking: the dedup's one host sync) and host-to-device copies of the distinct IDs, their lengths and the
reverse indices (and the accumulated weights, when asked); stock's per-table offsets are read once per buffer.

Example::

    sharders = get_default_hybrid_sharders(use_index_dedup=True)   # the stock flag, made exact
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.native import ops


def table_groups(hash_size_offsets: torch.Tensor) -> List[Tuple[int, int]]:
    """``(first feature, end feature)`` of each table, from stock's per-feature ``_hash_size_offset_tensor_{i}``.

    Stock stores, for every feature, the cumulative feature count of the tables before it; a table's first feature
    holds the start of its range and the next entry its end, the table's other features an empty range.

    Example::

        table_groups(torch.tensor([0, 2, 2, 3]))   # features 0-1 share a table, feature 2 has its own: [(0, 2), (2, 3)]
    """
    key = id(hash_size_offsets)
    held = _GROUPS.get(key)
    if held is None or held[0]() is not hash_size_offsets:  # a module's buffer never changes: read it (a D2H) once
        bounds = hash_size_offsets.tolist()
        held = _GROUPS[key] = (weakref.ref(hash_size_offsets, lambda _: _GROUPS.pop(key, None)),
                               [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a])
    return held[1]


#: id(buffer) -> (a weak reference to the buffer, its groups); an entry leaves with its buffer.
_GROUPS: Dict[int, Tuple[Any, List[Tuple[int, int]]]] = {}


def dedup_per_table(
    features: KeyedJaggedTensor, groups: List[Tuple[int, int]], accumulate_weights: bool = False
) -> Tuple[KeyedJaggedTensor, torch.Tensor]:
    """Each table's distinct IDs once, and the reverse indices that expand them back to ``features``' values.

    Args:
        features: one sharding's features (feature-major, as TorchRec splits them before the input dist).
        groups: ``(first feature, end feature)`` per table (see :func:`table_groups`); features of one table share
            its rows, so their IDs are deduped together.
        accumulate_weights: sum the weights of an ID's occurrences (TorchRec's feature-score accumulation); without
            it the result carries no weights, as in stock.

    Returns:
        The deduped features (same keys; a table's distinct IDs spread evenly over its features' bags, the layout
        stock's dedup sends) and int64 reverse indices with ``deduped.values()[reverse] == features.values()``.

    Example::

        kjt = KeyedJaggedTensor.from_lengths_sync(["a", "b"], torch.tensor([7, 7, 2**60, 7]), torch.tensor([2, 1, 1]))
        deduped, reverse = dedup_per_table(kjt, [(0, 1), (1, 2)])
        # deduped.values() == [7, 2**60, 7] (7 once per table), reverse == [0, 0, 1, 2]
    """
    device = features.values().device
    values = features.values().to("cpu", torch.int64)  # the batch's IDs on the host: one copy
    key_offsets = features.offset_per_key()
    strides = features.stride_per_key()
    uniques: List[torch.Tensor] = []
    lengths: List[torch.Tensor] = []
    reverse = torch.empty_like(values)
    base = 0
    for first, end in groups:
        start, stop = key_offsets[first], key_offsets[end]
        unique, inverse, _ = ops.hash_unique(values[start:stop])  # native, one pass
        reverse[start:stop] = inverse + base
        base += unique.numel()
        uniques.append(unique)
        bags = sum(strides[first:end])
        per_bag, extra = divmod(unique.numel(), bags) if bags else (0, 0)
        lengths.append(per_bag + (torch.arange(bags) < extra).to(torch.int64))
    reverse = reverse.to(device, non_blocking=True)
    weights: Optional[torch.Tensor] = None
    if accumulate_weights and features.weights_or_none() is not None:
        weights = torch.zeros(base, dtype=torch.float32, device=device)
        weights.scatter_add_(0, reverse, features.weights().to(torch.float32))
    deduped = KeyedJaggedTensor(
        keys=features.keys(),
        values=(torch.cat(uniques) if uniques else values[:0]).to(device, non_blocking=True),
        lengths=(torch.cat(lengths) if lengths else torch.empty(0, dtype=torch.int64)).to(device, non_blocking=True),
        weights=weights,
    )
    return deduped, reverse

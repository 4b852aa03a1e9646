"""Leave-one-out evaluation: HR@K and NDCG@K of each user's held-out last item, for the model and for popularity.

Protocol: every user is scored against the whole catalogue (every item that occurs in the data). The user's own
training items are excluded from the ranking (they cannot be recommended again), the held-out item never is. The
rank of the held-out item is the number of eligible items with a strictly higher score, so ties count in the
item's favour (this helps the popularity baseline, whose scores tie often, and never the model). ``HR@K`` is the
fraction of users whose item ranks below ``K``; ``NDCG@K`` averages ``1 / log2(rank + 2)`` over those users.

The item vectors are looked up a chunk of the catalogue at a time, then user histories are encoded a few users at a
time, so no call needs more of the item table's rows than its device cache holds. Users are split evenly over the
ranks; every rank runs the same number of model calls (the sharded embedding lookups are collective) and the sums
are all-reduced.
"""

from __future__ import annotations

import math
from typing import Dict, List

import torch
import torch.distributed as dist
from torch import nn

from batches import PAD, recent_history, sequence_features
from torchrec_ascend.datasets import UserSequences


def training_item_mask(split: UserSequences, users: torch.Tensor, catalogue: torch.Tensor) -> torch.Tensor:
    """Bool ``[len(users), len(catalogue)]``: true where the user has the item in their training sequence.

    Example::

        training_item_mask(split, torch.tensor([0]), catalogue).sum()   # length of user 0's training sequence
    """
    lengths = split.lengths[users]
    rows = torch.repeat_interleave(torch.arange(users.numel()), lengths)
    starts = torch.repeat_interleave(split.offsets[users], lengths)
    within = torch.arange(rows.numel()) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    items = split.items[starts + within]
    mask = torch.zeros(users.numel(), catalogue.numel(), dtype=torch.bool)
    mask[rows, torch.searchsorted(catalogue, items)] = True
    return mask


def ranking_sums(scores: torch.Tensor, target: torch.Tensor, exclude: torch.Tensor, k: int) -> torch.Tensor:
    """Sum of hits and of NDCG over a batch of users.

    Args:
        scores: float ``[B, I]`` over the catalogue.
        target: int64 ``[B]``, catalogue index of each user's held-out item.
        exclude: bool ``[B, I]``, items left out of the ranking (the target is always kept).
        k: cut-off.

    Returns:
        torch.Tensor: float64 ``[3]``: hits, NDCG sum, number of users.

    Example::

        ranking_sums(torch.tensor([[0.1, 0.9, 0.5]]), torch.tensor([2]), torch.zeros(1, 3, dtype=torch.bool), 1)
        # tensor([0., 0., 1.]): one item scores higher, rank 1 is not below k=1
    """
    rows = torch.arange(scores.shape[0])
    exclude = exclude.clone()
    exclude[rows, target] = False
    target_score = scores[rows, target]
    rank = ((scores > target_score[:, None]) & ~exclude).sum(1)
    hit = rank < k
    ndcg = torch.where(hit, 1.0 / torch.log2(rank.double() + 2), 0.0)
    return torch.stack([hit.double().sum(), ndcg.sum(), torch.tensor(float(scores.shape[0]), dtype=torch.float64)])


def my_users(num_users: int, rank: int, world_size: int, batch_size: int) -> List[torch.Tensor]:
    """This rank's user indices, in chunks; every rank gets the same number of non-empty chunks."""
    shards = torch.tensor_split(torch.arange(num_users), world_size)
    chunks = math.ceil(max(s.numel() for s in shards) / batch_size)
    return list(torch.tensor_split(shards[rank], chunks))


@torch.no_grad()
def item_vectors(model: nn.Module, catalogue: torch.Tensor, max_seq_len: int, chunk: int) -> torch.Tensor:
    """The model's unit-norm vectors of every catalogue item, looked up ``chunk`` items at a time (collective).

    Chunks keep each lookup within the item table's device cache (a KEY_VALUE cache holds the distinct items of one
    call, not the whole catalogue). Every rank looks up every chunk, so the ranks make the same calls.

    Returns:
        torch.Tensor: float ``[len(catalogue), D]``.

    Example::

        item_vectors(dmp.module, catalogue, max_seq_len=50, chunk=256).shape   # torch.Size([1682, 64])
    """
    no_history = torch.full((1, max_seq_len), PAD)
    return torch.cat([model.encode(sequence_features(no_history, items))[2] for items in catalogue.split(chunk)])


@torch.no_grad()
def evaluate(
    model: nn.Module,
    split: UserSequences,
    catalogue: torch.Tensor,
    max_seq_len: int,
    users_per_call: int,
    items_per_call: int,
    k: int = 10,
) -> Dict[str, float]:
    """HR@k and NDCG@k of the model and of the popularity baseline, over all users (collective call).

    Args:
        model: the unwrapped :class:`model.HSTURecommender` (``DistributedModelParallel.module``), its encoder in
            eval mode.
        split: leave-one-out split; the held-out items are the targets.
        catalogue: int64 ``[I]``, ascending: the items that are ranked.
        max_seq_len: history length fed to the model.
        users_per_call: users per rank whose histories one model call encodes.
        items_per_call: catalogue items one model call embeds.
        k: cut-off.

    Returns:
        Dict[str, float]: ``hstu_hr``, ``hstu_ndcg``, ``popularity_hr``, ``popularity_ndcg``, ``users``.

    Example::

        evaluate(dmp.module, split, catalogue, max_seq_len=50, users_per_call=64, items_per_call=256)["hstu_ndcg"]
    """
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    items = item_vectors(model, catalogue, max_seq_len, items_per_call)
    popularity = torch.bincount(torch.searchsorted(catalogue, split.items), minlength=catalogue.numel()).double()
    sums = {"hstu": torch.zeros(3, dtype=torch.float64), "popularity": torch.zeros(3, dtype=torch.float64)}
    for users in my_users(split.users.numel(), rank, world, users_per_call):
        history = recent_history(split, users, max_seq_len)
        states, lengths, _ = model.encode(sequence_features(history, catalogue[:0]))
        last_state = states[torch.arange(users.numel()), lengths - 1]
        target = torch.searchsorted(catalogue, split.held_out[users])
        exclude = training_item_mask(split, users, catalogue)
        sums["hstu"] += ranking_sums(last_state @ items.T, target, exclude, k)
        sums["popularity"] += ranking_sums(popularity.expand(users.numel(), -1), target, exclude, k)
    metrics: Dict[str, float] = {}
    for name, total in sums.items():
        if world > 1:
            dist.all_reduce(total)
        metrics[f"{name}_hr"] = float(total[0] / total[2])
        metrics[f"{name}_ndcg"] = float(total[1] / total[2])
    metrics["users"] = float(sums["hstu"][2])
    return metrics

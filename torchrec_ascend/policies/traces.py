"""ID access traces for the cache simulator: stationary Zipf, drifting popularity, MovieLens-100K.

A trace is a 1-D int64 tensor of raw IDs in access order. Synthetic traces scramble popularity ranks into
63-bit IDs (as hashed feature IDs look), so the caches under test also see huge keys.

Example::

    trace = make_trace("zipf", num_accesses=1_000_000, num_keys=100_000, alpha=1.0, seed=0)
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.hashing import mix64
from torchrec_ascend.policies.options import positive_int, real


def _zipf_ranks(num_accesses: int, num_keys: int, alpha: float, generator: torch.Generator) -> torch.Tensor:
    weights = torch.arange(1, num_keys + 1, dtype=torch.float64).pow(-alpha)
    return torch.multinomial(weights, num_accesses, replacement=True, generator=generator)


def zipf_trace(num_accesses: int, num_keys: int, alpha: float = 1.0, seed: int = 0) -> torch.Tensor:
    """Independent accesses with Zipf popularity: rank ``r`` (from 1) is drawn with probability ``∝ r**-alpha``.

    Args:
        num_accesses (int): trace length.
        num_keys (int): catalogue size.
        alpha (float): skew; 0 is uniform, around 1 is typical of recommendation IDs.
        seed (int): seeds sampling and the rank -> ID scrambling.

    Returns:
        torch.Tensor: int64 ``[num_accesses]`` IDs in ``[0, 2**63)``.

    Raises:
        ConfigError: a size is not a positive integer or ``alpha`` is not finite.

    Example::

        trace = zipf_trace(10_000, 1_000, alpha=0.9)
    """
    num_accesses = positive_int("zipf", "num_accesses", num_accesses)
    num_keys = positive_int("zipf", "num_keys", num_keys)
    generator = torch.Generator().manual_seed(seed)
    return mix64(_zipf_ranks(num_accesses, num_keys, real("zipf", "alpha", alpha), generator), seed)


def drifting_trace(
    num_accesses: int, num_keys: int, alpha: float = 1.0, phases: int = 10, shift: int = 0, seed: int = 0
) -> torch.Tensor:
    """Zipf accesses whose hot set moves: in phase ``p`` rank ``r`` maps to key ``(r + p * shift) % num_keys``.

    The trace is cut into ``phases`` equal phases; every phase the popularity ranking rotates by ``shift`` keys
    (default ``num_keys // 100``), so the hottest keys of one phase cool down and unseen keys heat up.

    Args:
        num_accesses (int): trace length.
        num_keys (int): catalogue size.
        alpha (float): Zipf skew within a phase.
        phases (int): number of phases.
        shift (int): keys the ranking rotates by per phase; 0 means ``max(1, num_keys // 100)``.
        seed (int): seeds sampling and scrambling.

    Returns:
        torch.Tensor: int64 ``[num_accesses]`` IDs.

    Raises:
        ConfigError: an option is out of range.

    Example::

        trace = drifting_trace(100_000, 10_000, phases=20)
    """
    num_accesses = positive_int("drift", "num_accesses", num_accesses)
    num_keys = positive_int("drift", "num_keys", num_keys)
    phases = positive_int("drift", "phases", phases)
    shift = shift or max(1, num_keys // 100)
    generator = torch.Generator().manual_seed(seed)
    ranks = _zipf_ranks(num_accesses, num_keys, real("drift", "alpha", alpha), generator)
    phase = torch.arange(num_accesses, dtype=torch.int64) * phases // num_accesses
    return mix64((ranks + phase * shift) % num_keys, seed)


def movielens_trace(seed: int = 0, **loader_options: Any) -> torch.Tensor:
    """MovieLens-100K item IDs: each user's ratings in time order, users interleaved round-robin.

    Position ``i`` of every user's sequence comes before position ``i + 1`` of any user; within a round users
    appear in a seeded random order. This keeps per-user temporal locality while mixing users, as a training
    stream that batches many users' histories does.

    Args:
        seed (int): order of the users within a round.
        **loader_options: passed to :func:`torchrec_ascend.datasets.load_movielens_100k` (``cache_dir``).

    Returns:
        torch.Tensor: int64 ``[100000]`` raw item IDs.

    Raises:
        StorageError: the data cannot be downloaded or read (see the loader).

    Example::

        trace = movielens_trace()
    """
    from torchrec_ascend.datasets import load_movielens_100k  # the download machinery loads only when used

    data = load_movielens_100k(**loader_options).chronological()
    by_user = torch.sort(data.user, stable=True).indices  # stable: each user's items stay in time order
    users, items = data.user[by_user], data.item[by_user]
    _, counts = torch.unique_consecutive(users, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    position = torch.arange(users.numel()) - torch.repeat_interleave(starts, counts)
    user_rank = torch.randperm(counts.numel(), generator=torch.Generator().manual_seed(seed))
    user_index = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    order = torch.argsort(position * counts.numel() + user_rank[user_index])
    return items[order]


TRACES: Dict[str, Callable[..., torch.Tensor]] = {
    "zipf": zipf_trace,
    "drift": drifting_trace,
    "movielens": movielens_trace,
}


def make_trace(name: str, **options: Any) -> torch.Tensor:
    """Build the trace ``name`` (``"zipf"``, ``"drift"`` or ``"movielens"``) with its options.

    Raises:
        ConfigError: unknown trace name.

    Example::

        make_trace("drift", num_accesses=10_000, num_keys=1_000)
    """
    if name not in TRACES:
        raise ConfigError(f"unknown trace {name!r}; choose one of {sorted(TRACES)}")
    return TRACES[name](**options)

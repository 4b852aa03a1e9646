"""A bounded, vectorized key -> score table for policies that track keys which hold no slot.

Admission policies accumulate counts (or show/click scores) of keys that are not admitted yet, and ghost queues
remember keys that were just evicted. The number of such keys is unbounded, so the table is direct-mapped: a key
lives only in bucket ``mix64(key) % size``; memory is fixed at ``size`` entries (16 bytes each).

Collision rule (one key per bucket, frequency-biased, in the spirit of Misra-Gries / HeavyKeeper): a newcomer
takes the bucket when its amount is at least the occupant's score; otherwise the occupant's score is reduced by
the newcomer's amount and the newcomer is not tracked. Consequences, documented because admission relies on them:

* a score is never inflated: ``add`` returns at most the true accumulated amount of a key;
* under collisions a score can be lost or reduced (so an admission threshold is reached later, never earlier);
* with ``size`` well above the number of keys pending at once, collisions are rare and scores are exact.

Within one call, several newcomers may hash to the same bucket: the one with the largest amount (then the
smallest key) contends for it, the others are not tracked. Every operation is a handful of tensor ops.
"""

from __future__ import annotations

from typing import Dict

import torch

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.hashing import mix64
from torchrec_ascend.policies.options import load_tensors

EMPTY = -1  # keys are non-negative, so -1 marks a free bucket


class BoundedKeyScores:
    """Direct-mapped table from int64 keys to float64 scores with a fixed number of buckets.

    Args:
        size (int): number of buckets (the most keys tracked at once); at least 1.
        seed (int): hash seed, so two tables can collide differently.

    Raises:
        ConfigError: ``size`` is not a positive integer.

    Example::

        table = BoundedKeyScores(1 << 16)
        table.add(torch.tensor([5, 9]), torch.tensor([1.0, 2.0]))  # tensor([1., 2.])
        table.add(torch.tensor([5]), torch.tensor([1.0]))          # tensor([2.])
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"a bounded key table needs a positive integer size, got {size!r}")
        self.size = size
        self.seed = seed
        self.keys = torch.full((size,), EMPTY, dtype=torch.int64)
        self.scores = torch.zeros(size, dtype=torch.float64)

    def bucket(self, keys: torch.Tensor) -> torch.Tensor:
        """The bucket of each key, int64 in ``[0, size)``, same shape as ``keys``."""
        return mix64(keys, self.seed) % self.size

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """Tracked score of each key (0 for keys not tracked), float64 of ``keys``' shape."""
        b = self.bucket(keys)
        return torch.where(self.keys[b] == keys, self.scores[b], torch.zeros((), dtype=torch.float64))

    def add(self, keys: torch.Tensor, amounts: torch.Tensor) -> torch.Tensor:
        """Add ``amounts`` to the scores of unique ``keys``; return each key's accumulated score.

        Args:
            keys (torch.Tensor): unique int64 keys, shape ``[n]``.
            amounts (torch.Tensor): non-negative amounts, shape ``[n]``.

        Returns:
            torch.Tensor: float64 ``[n]``: previously tracked score (0 if untracked) plus ``amounts``, whether or
            not the key won a bucket.
        """
        amounts = amounts.to(torch.float64)
        b = self.bucket(keys)
        match = self.keys[b] == keys
        totals = torch.where(match, self.scores[b], torch.zeros((), dtype=torch.float64)) + amounts
        self.scores[b[match]] = totals[match]  # distinct keys never match the same bucket
        new = ~match
        if bool(new.any()):
            self._contend(keys[new], b[new], amounts[new])
        return totals

    def _contend(self, keys: torch.Tensor, buckets: torch.Tensor, amounts: torch.Tensor) -> None:
        # one contender per bucket: sort by key, then amount descending, then bucket (stable sorts keep the ties)
        order = torch.argsort(keys, stable=True)
        order = order[torch.argsort(amounts[order], descending=True, stable=True)]
        order = order[torch.argsort(buckets[order], stable=True)]
        b = buckets[order]
        first = torch.ones_like(b, dtype=torch.bool)
        first[1:] = b[1:] != b[:-1]
        win = order[first]
        wb, wk, wa = buckets[win], keys[win], amounts[win]
        occupant = self.scores[wb]
        takes = (self.keys[wb] == EMPTY) | (wa >= occupant)
        self.keys[wb[takes]] = wk[takes]
        self.scores[wb[takes]] = wa[takes]
        self.scores[wb[~takes]] = occupant[~takes] - wa[~takes]

    def discard(self, keys: torch.Tensor) -> None:
        """Stop tracking ``keys`` (absent keys are ignored)."""
        b = self.bucket(keys)
        hit = b[self.keys[b] == keys]
        self.keys[hit] = EMPTY
        self.scores[hit] = 0.0

    def __len__(self) -> int:
        return int((self.keys != EMPTY).sum())

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """A copy of the table: ``{"keys": int64 [size], "scores": float64 [size]}``."""
        return {"keys": self.keys.clone(), "scores": self.scores.clone()}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        """Restore a copy of :meth:`state_dict`'s output.

        Raises:
            ConfigError: the saved table has another size (the hash layout depends on it).
        """
        load_tensors(state, {"keys": self.keys, "scores": self.scores}, "bounded key table",
                     f"restore it into a table created with the same size ({self.size})")

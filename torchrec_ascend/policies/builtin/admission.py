"""Admission by accumulated count threshold and by probability (deterministic per seed, key and step)."""

from __future__ import annotations

import abc
from typing import Dict, Optional

import torch

from torchrec_ascend.policies.base import AdmissionPolicy
from torchrec_ascend.policies.hashing import mix64, uniform
from torchrec_ascend.policies.key_table import BoundedKeyScores
from torchrec_ascend.policies.options import fraction, positive_int

DEFAULT_MAX_TRACKED = 1 << 20


class ThresholdAdmission(AdmissionPolicy):
    """Admits a key once the amount it accumulated over the batches it was seen in reaches ``threshold``.

    Subclasses define the per-batch :meth:`amount`. Pending keys live in a :class:`BoundedKeyScores` of
    ``max_tracked`` buckets (16 bytes each): memory is bounded, an amount is never over-counted (so a key is never
    admitted early), and under hash collisions a pending amount can be lost or reduced (admission comes later).
    Admitted keys stop being tracked.

    Args:
        threshold (float): amount needed for admission.
        max_tracked (int): buckets of the pending-key table.
    """

    def __init__(self, threshold: float, max_tracked: int) -> None:
        super().__init__()
        self.threshold = threshold
        self.pending = BoundedKeyScores(max_tracked)

    @abc.abstractmethod
    def amount(self, counts: torch.Tensor, signals: Optional[Dict[str, torch.Tensor]]) -> torch.Tensor:
        """float64 amount each key adds in this batch, aligned with ``counts``."""

    def admit(
        self,
        keys: torch.Tensor,
        counts: torch.Tensor,
        step: int,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> torch.Tensor:
        totals = self.pending.add(keys, self.amount(counts, signals))
        admitted = totals >= self.threshold
        self.pending.discard(keys[admitted])
        return admitted

    def forget(self, keys: torch.Tensor) -> None:
        self.pending.discard(keys)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return self.pending.state_dict()

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        self.pending.load_state_dict(state)


class CountAdmission(ThresholdAdmission):
    """Admits a key once it has been seen ``threshold`` times in total (RecSDK's POLICY_COUNT).

    Args:
        threshold (int): occurrences needed; 1 admits everything.
        max_tracked (int): most pending keys tracked at once (see :class:`ThresholdAdmission`).

    Raises:
        ConfigError: an option is not a positive integer.

    Example::

        policy = CountAdmission(threshold=3)
        policy.admit(torch.tensor([7, 8]), torch.tensor([1, 3]), step=0)  # tensor([False, True])
        policy.admit(torch.tensor([7]), torch.tensor([2]), step=1)        # tensor([True])
    """

    def __init__(self, threshold: int = 2, max_tracked: int = DEFAULT_MAX_TRACKED) -> None:
        super().__init__(
            positive_int("count", "threshold", threshold), positive_int("count", "max_tracked", max_tracked)
        )

    def amount(self, counts: torch.Tensor, signals: Optional[Dict[str, torch.Tensor]]) -> torch.Tensor:
        return counts.to(torch.float64)


class ProbabilisticAdmission(AdmissionPolicy):
    """Admits each (key, step) with probability ``probability``, reproducibly.

    The decision is a pure function of ``(seed, key, step)`` (a hash, no random state), so replays and restarts
    decide the same; a key rejected now gets a fresh chance when it shows up at a later step, so a key seen in
    ``n`` steps is admitted with probability ``1 - (1 - probability) ** n``.

    Args:
        probability (float): in ``[0, 1]``.
        seed (int): selects the hash stream.

    Raises:
        ConfigError: ``probability`` is outside ``[0, 1]``.

    Example::

        policy = ProbabilisticAdmission(probability=0.5, seed=1)
        policy.admit(torch.arange(4), torch.ones(4, dtype=torch.int64), step=0)
    """

    def __init__(self, probability: float = 0.5, seed: int = 0) -> None:
        super().__init__()
        self.probability = fraction("probabilistic", "probability", probability)
        self.seed = int(seed)

    def admit(
        self,
        keys: torch.Tensor,
        counts: torch.Tensor,
        step: int,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> torch.Tensor:
        step_salt = mix64(torch.tensor([step], dtype=torch.int64), self.seed)
        return uniform(mix64(keys, self.seed) ^ step_salt, self.seed) < self.probability

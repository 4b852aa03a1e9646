"""Show/click scores (RecSDK's POLICY_SHOWCLICK): evict the lowest decayed engagement, admit on accumulated score."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from torchrec_ascend.policies.builtin.admission import DEFAULT_MAX_TRACKED, ThresholdAdmission
from torchrec_ascend.policies.options import fraction, non_negative, positive_int, real
from torchrec_ascend.policies.scored import ScoredEvictionPolicy, lowest


def shows_and_clicks(
    counts: torch.Tensor, signals: Optional[Dict[str, torch.Tensor]]
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Per-key ``(shows, clicks)`` as float64: ``signals["shows"]`` or the batch counts, ``signals["clicks"]`` or
    None (no clicks: their term is 0, and skipped)."""
    signals = signals or {}
    shows = signals.get("shows", counts).to(torch.float64)
    clicks = signals["clicks"].to(torch.float64) if "clicks" in signals else None
    return shows, clicks


class ShowClickEviction(ScoredEvictionPolicy):
    """Keeps a decayed engagement score per slot and evicts the lowest-scoring slots.

    On every access ``score = score * score_decay ** (steps since its last update) + alpha * show + beta * click``
    (RecSDK's ``(old + alpha*show + beta*click) * decay`` with the decay applied once per step, lazily, so idle
    slots decay too). ``show`` is ``signals["shows"]`` or the batch count, ``click`` is ``signals["clicks"]`` or 0.
    :meth:`expired` nominates the lowest-scoring ``evict_percentage`` of the resident slots, RecSDK's periodic
    eviction; the owner asks for it at its eviction cadence (see :class:`EvictionCadence`), not every step.

    Args:
        capacity (int): number of slots.
        alpha (float): weight of shows.
        beta (float): weight of clicks.
        score_decay (float): factor in ``[0, 1]`` applied per step.
        evict_percentage (float): fraction in ``[0, 1]`` of resident slots :meth:`expired` nominates.

    Raises:
        ConfigError: an option is out of range.

    Example::

        policy = ShowClickEviction(capacity=4, alpha=1.0, beta=5.0, score_decay=0.99, evict_percentage=0.25)
        policy.on_insert(torch.tensor([0, 1]), torch.tensor([7, 8]), step=0,
                         signals={"clicks": torch.tensor([1, 0])})
        policy.select_victims(1, torch.ones(4, dtype=torch.bool), step=1)  # tensor([1])
    """

    state_names = ("score", "last_step")

    def __init__(
        self,
        capacity: int,
        alpha: float = 1.0,
        beta: float = 0.0,
        score_decay: float = 1.0,
        evict_percentage: float = 0.0,
    ) -> None:
        super().__init__(capacity)
        self.alpha = real("showclick", "alpha", alpha)
        self.beta = real("showclick", "beta", beta)
        self.score_decay = fraction("showclick", "score_decay", score_decay)
        self.evict_percentage = fraction("showclick", "evict_percentage", evict_percentage)
        self.score = torch.zeros(capacity, dtype=torch.float64)
        self.last_step = torch.zeros(capacity, dtype=torch.int64)

    def reset(self, slots: torch.Tensor, keys: torch.Tensor, step: int) -> None:
        self.score.index_fill_(0, slots, 0.0)  # decays to 0 whatever its last step: record() stamps that

    def _decayed(self, score: torch.Tensor, last: torch.Tensor, step: int) -> torch.Tensor:
        if self.score_decay == 1.0:  # no decay (the default): the scores as they are, no power of each slot
            return score
        idle = (step - last).clamp(min=0).to(torch.float64)
        return score * torch.pow(torch.tensor(self.score_decay, dtype=torch.float64), idle)

    def record(
        self, slots: torch.Tensor, counts: torch.Tensor, step: int, signals: Optional[Dict[str, torch.Tensor]]
    ) -> None:
        shows, clicks = shows_and_clicks(counts, signals)
        if self.score_decay != 1.0:
            old = self._decayed(self.score.index_select(0, slots), self.last_step.index_select(0, slots), step)
            self.score.index_copy_(0, slots, old)
        # The slots are distinct: each index_add_ adds one term per slot, in the formula's order.
        self.score.index_add_(0, slots, shows, alpha=self.alpha)
        if clicks is not None:
            self.score.index_add_(0, slots, clicks, alpha=self.beta)
        self.last_step.index_fill_(0, slots, step)

    def scores(self, step: int) -> torch.Tensor:
        return self._decayed(self.score, self.last_step, step)

    def expired(self, step: int) -> torch.Tensor:
        num = int(self.evict_percentage * int(self.resident.sum())) if self.evict_percentage else 0
        return lowest(self.scores(step), self.resident, num) if num else torch.empty(0, dtype=torch.int64)


class ShowClickAdmission(ThresholdAdmission):
    """Admits a key once its accumulated ``alpha * show + beta * click`` reaches ``threshold``.

    ``show`` is ``signals["shows"]`` or the batch count, ``click`` is ``signals["clicks"]`` or 0 (RecSDK's
    POLICY_SHOWCLICK admission). Pending scores are tracked as in :class:`ThresholdAdmission`.

    Args:
        alpha (float): weight of shows, >= 0.
        beta (float): weight of clicks, >= 0.
        threshold (float): score needed, >= 0.
        max_tracked (int): most pending keys tracked at once.

    Raises:
        ConfigError: an option is out of range.

    Example::

        policy = ShowClickAdmission(alpha=0.1, beta=1.0, threshold=1.0)
        policy.admit(torch.tensor([7, 8]), torch.tensor([1, 1]), step=0,
                     signals={"clicks": torch.tensor([1, 0])})  # tensor([True, False])
    """

    def __init__(
        self, alpha: float = 1.0, beta: float = 0.0, threshold: float = 1.0, max_tracked: int = DEFAULT_MAX_TRACKED
    ) -> None:
        super().__init__(
            non_negative("showclick", "threshold", threshold), positive_int("showclick", "max_tracked", max_tracked)
        )
        self.alpha = non_negative("showclick", "alpha", alpha)
        self.beta = non_negative("showclick", "beta", beta)

    def amount(self, counts: torch.Tensor, signals: Optional[Dict[str, torch.Tensor]]) -> torch.Tensor:
        shows, clicks = shows_and_clicks(counts, signals)
        return self.alpha * shows if clicks is None else self.alpha * shows + self.beta * clicks

"""Training and evaluation batches of the MovieLens HSTU example, as KeyedJaggedTensors of raw item IDs.

Training examples are windows of up to ``max_seq_len + 1`` consecutive items of one user's training sequence
(leave-one-out split). Windows are cut from the end of each sequence and overlap by one item, so every transition
``item[t] -> item[t + 1]`` is a target exactly once per epoch. A batch carries two features of the one item table:

* ``history``: the window minus its last item (jagged, one sequence per window);
* ``candidates``: the unique items that the batch scores against (every target of the batch plus random negatives
  from the catalogue), all in the first sample. Only these rows are looked up: the sampled softmax never touches the
  rest of the table, which is what lets the item table live in a cache smaller than the catalogue.

``labels[b, t]`` is the index in ``candidates`` of the item that follows position ``t`` of window ``b``, or
``IGNORE`` past the window's end. Everything here is vectorised; nothing loops over IDs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from embedding_tables import CANDIDATES, HISTORY
from torchrec_ascend.datasets import UserSequences

PAD = -1
IGNORE = -100  # F.cross_entropy's default ignore_index


@dataclasses.dataclass
class SequenceBatch(Pipelineable):
    """One training batch (what ``TrainPipelineSparseDist`` moves and the model consumes).

    Attributes:
        features: keys ``history`` (``B`` sequences) and ``candidates`` (``C`` items in sample 0).
        labels: int64 ``[B, L]``: candidate index of the next item, ``IGNORE`` where there is none.

    Example::

        batch = make_batch(windows[:4], negatives=torch.tensor([5, 6]))
        batch.features.keys()   # ['history', 'candidates']
    """

    features: KeyedJaggedTensor
    labels: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> "SequenceBatch":
        return SequenceBatch(self.features.to(device, non_blocking), self.labels.to(device, non_blocking=non_blocking))

    def record_stream(self, stream: torch.Stream) -> None:
        self.features.record_stream(stream)
        self.labels.record_stream(stream)

    def pin_memory(self) -> "SequenceBatch":
        return SequenceBatch(self.features.pin_memory(), self.labels.pin_memory())


def gather_padded(items: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    """Rows ``items[starts[r] : starts[r] + lengths[r]]``, right-padded with ``PAD`` to ``width``.

    Args:
        items: int64 ``[N]``.
        starts, lengths: int64 ``[R]``, ``lengths <= width``, ranges inside ``items``.
        width: row width.

    Returns:
        torch.Tensor: int64 ``[R, width]``.

    Example::

        gather_padded(torch.arange(10), torch.tensor([2, 7]), torch.tensor([3, 1]), 3)
        # tensor([[ 2,  3,  4], [ 7, -1, -1]])
    """
    columns = torch.arange(width)
    valid = columns < lengths[:, None]
    index = (starts[:, None] + columns).clamp(max=max(items.numel() - 1, 0))
    return torch.where(valid, items[index], PAD)


def training_windows(split: UserSequences, max_seq_len: int) -> torch.Tensor:
    """Cut every training sequence into windows of at most ``max_seq_len + 1`` items (see module docstring).

    Args:
        split: leave-one-out training sequences.
        max_seq_len: model input length ``L``.

    Returns:
        torch.Tensor: int64 ``[W, L + 1]``, right-padded with ``PAD``; every row holds at least 2 items. A user
        with one training item has no transition and contributes no window.

    Example::

        training_windows(leave_one_out(data), max_seq_len=50).shape   # torch.Size([2860, 51])
    """
    lengths = split.lengths
    per_user = torch.div(lengths - 1 + max_seq_len - 1, max_seq_len, rounding_mode="floor").clamp(min=0)
    user = torch.repeat_interleave(torch.arange(lengths.numel()), per_user)
    first = torch.repeat_interleave(torch.cumsum(per_user, 0) - per_user, per_user)
    from_end = torch.arange(user.numel()) - first
    ends = split.offsets[user] + lengths[user] - from_end * max_seq_len
    starts = torch.maximum(split.offsets[user], ends - max_seq_len - 1)
    return gather_padded(split.items, starts, ends - starts, max_seq_len + 1)


def recent_history(split: UserSequences, users: torch.Tensor, max_seq_len: int) -> torch.Tensor:
    """The last ``max_seq_len`` training items of the given users (row indices into ``split``), right-padded.

    Returns:
        torch.Tensor: int64 ``[len(users), max_seq_len]``.

    Example::

        recent_history(split, torch.tensor([0, 1]), 50).shape   # torch.Size([2, 50])
    """
    lengths = split.lengths[users].clamp(max=max_seq_len)
    return gather_padded(split.items, split.offsets[users + 1] - lengths, lengths, max_seq_len)


def sequence_features(history: torch.Tensor, candidates: torch.Tensor) -> KeyedJaggedTensor:
    """Build the model input: padded ``history`` ``[B, L]`` as jagged sequences, ``candidates`` ``[C]`` in sample 0.

    Example::

        sequence_features(torch.tensor([[3, 4, -1]]), torch.tensor([4, 9])).lengths()   # tensor([2, 2])
    """
    valid = history != PAD
    candidate_lengths = torch.zeros(history.shape[0], dtype=torch.int64)
    candidate_lengths[0] = candidates.numel()
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[HISTORY, CANDIDATES],
        values=torch.cat([history[valid], candidates]),
        lengths=torch.cat([valid.sum(1), candidate_lengths]),
    )


def make_batch(windows: torch.Tensor, negatives: torch.Tensor) -> SequenceBatch:
    """Turn windows ``[B, L + 1]`` and random negative items ``[M]`` into a :class:`SequenceBatch`.

    Example::

        make_batch(torch.tensor([[1, 2, 3]]), torch.tensor([7])).labels   # tensor([[0, 1]]): candidates [2, 3, 7]
    """
    history, targets = windows[:, :-1], windows[:, 1:]
    has_target = targets != PAD
    history = torch.where(has_target, history, PAD)
    positives = targets[has_target]
    candidates, inverse = torch.unique(torch.cat([positives, negatives]), return_inverse=True)
    labels = torch.full_like(targets, IGNORE)
    labels[has_target] = inverse[: positives.numel()]
    return SequenceBatch(sequence_features(history, candidates), labels)


class TrainBatches:
    """Shuffled training batches of one rank, epoch by epoch, identical across runs with the same seed.

    Every epoch draws one permutation of all windows (same on every rank) and gives rank ``r`` the ``r``-th slice
    of each global batch, so all ranks run the same number of steps. The permutation is extended by wrapping around
    so the last global batch is full (a few windows appear twice in that epoch; none is skipped).

    Args:
        windows: int64 ``[W, L + 1]`` from :func:`training_windows`.
        catalogue: int64 ``[I]`` item IDs that negatives are drawn from.
        batch_size: windows per rank per step.
        num_negatives: random negatives per batch (on top of the batch's own targets).
        rank, world_size: this process and the number of processes.
        seed: base seed; epoch ``e`` on rank ``r`` uses seeds derived from ``(seed, e, r)``.

    Example::

        loader = TrainBatches(windows, catalogue, batch_size=64, num_negatives=256, rank=0, world_size=2)
        for batch in loader.epoch(0):
            loss, _ = model(batch)
    """

    def __init__(
        self,
        windows: torch.Tensor,
        catalogue: torch.Tensor,
        batch_size: int,
        num_negatives: int,
        rank: int,
        world_size: int,
        seed: int = 0,
    ) -> None:
        self.windows = windows
        self.catalogue = catalogue
        self.batch_size = batch_size
        self.num_negatives = num_negatives
        self.rank = rank
        self.world_size = world_size
        self.seed = seed

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.windows.shape[0] / (self.batch_size * self.world_size))

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[SequenceBatch]:
        """Yield this rank's batches of ``epoch``, after the first ``skip`` (a job resumed mid-epoch).

        The batches after ``skip`` are those an uninterrupted epoch yields (the skipped ones still draw their
        negatives, so the random stream is where it would be).
        """
        shared = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(self.windows.shape[0], generator=shared)
        total = self.steps_per_epoch * self.batch_size * self.world_size
        order = order.repeat(math.ceil(total / order.numel()))[:total]
        mine = order.view(self.steps_per_epoch, self.world_size, self.batch_size)[:, self.rank]
        local = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 1_009 + self.rank)
        for step, rows in enumerate(mine):
            draws = torch.randint(self.catalogue.numel(), (self.num_negatives,), generator=local)
            if step >= skip:
                yield make_batch(self.windows[rows], self.catalogue[draws])

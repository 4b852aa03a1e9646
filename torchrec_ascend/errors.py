"""Exception types of torchrec-ascend: one base class, so callers can catch everything we raise on purpose."""

from __future__ import annotations

from typing import Any, Callable, Sequence


class TorchRecAscendError(Exception):
    """Base class of every error torchrec-ascend raises deliberately."""


class ConfigError(TorchRecAscendError, ValueError):
    """A table, plan or option is invalid; the message names it and says what to change."""


class BackendError(TorchRecAscendError, RuntimeError):
    """A device backend is unknown or cannot be used here (for example torch_npu fails to import)."""


class PluginError(TorchRecAscendError, RuntimeError):
    """A plugin failed to load, raised inside a hook, or returned malformed output."""


class CapacityError(TorchRecAscendError, RuntimeError):
    """A hash table is full and its overflow rule is ``"error"``, a batch does not fit a cache, or a checkpoint shard
    does not fit host memory."""


class StorageError(TorchRecAscendError, OSError):
    """A cache tier or checkpoint file cannot be written or read back intact; the message names the file."""


class InputError(TorchRecAscendError, ValueError):
    """A batch breaks a rule of its table (a negative ID); the message names the table, the feature and the rule."""


class RankLostError(TorchRecAscendError, RuntimeError):
    """Another rank of the job is gone (killed, or its host is down); the message names it and what this rank was
    doing."""


def check_non_negative_ids(
    ids: Any, features: Sequence[str], ends: Callable[[], Sequence[int]], table_of: Callable[[str], str]
) -> None:
    """Refuse a batch with a negative ID, naming the table and feature of the first one.

    Costs one ``min`` over ``ids`` (pass a host tensor: on a device that is a sync); ``ends`` and ``table_of`` are
    called only when an ID is negative (reading a KeyedJaggedTensor's offsets may cost a device sync).

    Args:
        ids: a 1-D integer tensor of the batch's IDs, feature-major.
        features: the feature of each segment of ``ids``.
        ends: returns where each feature's segment ends in ``ids`` (cumulative, one per feature).
        table_of: the hash table of a feature.

    Raises:
        InputError: an ID is negative.

    Example::

        check_non_negative_ids(torch.tensor([3, -1]), ["user"], lambda: [2], lambda feature: "users")
        # InputError: hash table 'users', feature 'user': IDs must be non-negative int64, got -1. ...
    """
    if not ids.numel() or int(ids.min()) >= 0:
        return
    first = int((ids < 0).nonzero()[0])
    feature = features[min(sum(end <= first for end in ends()), len(features) - 1)]
    raise InputError(
        f"hash table {table_of(feature)!r}, feature {feature!r}: IDs must be non-negative int64, got "
        f"{int(ids[first])}. Map negative IDs to non-negative ones (e.g. x & (2**63 - 1)) before the lookup."
    )

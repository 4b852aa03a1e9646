"""Exception types of torchrec-ascend: one base class, so callers can catch everything we raise on purpose."""

from __future__ import annotations


class TorchRecAscendError(Exception):
    """Base class of every error torchrec-ascend raises deliberately."""


class ConfigError(TorchRecAscendError, ValueError):
    """A table, plan or option is invalid; the message names it and says what to change."""


class BackendError(TorchRecAscendError, RuntimeError):
    """A device backend is unknown or cannot be used here (for example torch_npu fails to import)."""


class PluginError(TorchRecAscendError, RuntimeError):
    """A plugin failed to load, raised inside a hook, or returned malformed output."""


class CapacityError(TorchRecAscendError, RuntimeError):
    """A hash table is full and its overflow rule is ``"error"``."""


class StorageError(TorchRecAscendError, OSError):
    """A cache tier or checkpoint file cannot be written or read back intact; the message names the file."""

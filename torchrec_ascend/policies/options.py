"""Validation of policy options, so every policy reports a bad option the same way.

Each check returns the value (converted where harmless) or raises :class:`ConfigError` naming the policy, the
option, the rule and the value received; :func:`load_tensors` does the same for a state being restored.

Example::

    self.epoch_steps = positive_int("epoch_lru", "epoch_steps", epoch_steps)
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping

import torch

from torchrec_ascend.errors import ConfigError


def _fail(policy: str, option: str, rule: str, value: Any) -> ConfigError:
    return ConfigError(f"policy {policy!r}: option {option!r} must be {rule}, got {value!r}")


def positive_int(policy: str, option: str, value: Any) -> int:
    """``value`` as an int >= 1.

    Raises:
        ConfigError: ``value`` is not an integer or is below 1.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise _fail(policy, option, "an integer >= 1", value)
    return int(value)


def non_negative_int(policy: str, option: str, value: Any) -> int:
    """``value`` as an int >= 0.

    Raises:
        ConfigError: ``value`` is not an integer or is negative.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise _fail(policy, option, "an integer >= 0", value)
    return int(value)


def non_negative(policy: str, option: str, value: Any) -> float:
    """``value`` as a float >= 0.

    Raises:
        ConfigError: ``value`` is not a real number or is negative.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value) >= 0:
        raise _fail(policy, option, "a real number >= 0", value)
    return float(value)


def fraction(policy: str, option: str, value: Any) -> float:
    """``value`` as a float in ``[0, 1]``.

    Raises:
        ConfigError: ``value`` is not a real number in ``[0, 1]``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) <= 1:
        raise _fail(policy, option, "a real number in [0, 1]", value)
    return float(value)


def real(policy: str, option: str, value: Any) -> float:
    """``value`` as a finite float.

    Raises:
        ConfigError: ``value`` is not a finite real number.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value or abs(value) == float("inf"):
        raise _fail(policy, option, "a finite real number", value)
    return float(value)


def load_tensors(state: Mapping[str, Any], into: Mapping[str, torch.Tensor], what: str, hint: str) -> None:
    """Copy ``state[name]`` into each tensor ``into[name]``, once every one is found with its shape and dtype.

    Args:
        state: the state to restore (a ``state_dict`` output).
        into: the tensors it restores, by name.
        what: names the owner in messages (e.g. ``"LRU"``).
        hint: what to do instead, ending the message.

    Raises:
        ConfigError: a tensor is missing or of another shape or dtype; nothing was copied.

    Example::

        load_tensors(state, {"keys": self.keys}, "bounded key table", "restore it into a table of the same size")
    """
    for name, ref in into.items():
        got = state.get(name)
        if not isinstance(got, torch.Tensor) or got.shape != ref.shape or got.dtype != ref.dtype:
            found = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
            raise ConfigError(
                f"{what} state {name!r}: expected {tuple(ref.shape)} {ref.dtype}, got "
                f"{'nothing' if got is None else found}; {hint}"
            )
    for name, ref in into.items():
        ref.copy_(state[name])

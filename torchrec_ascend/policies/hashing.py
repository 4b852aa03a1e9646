"""Vectorized 64-bit key hashing for policies: bucket indices and per-key pseudo-random numbers.

Policies that track raw keys (admission counters, ghost queues, sketches) need a hash that spreads any int64 key,
including ``2**63 - 1``, uniformly and reproducibly. This is the SplitMix64 finalizer written with int64 torch ops:
products wrap modulo 2**64 and right shifts are made logical by masking, so the result matches the reference
unsigned-integer definition bit for bit.
"""

from __future__ import annotations

import torch

_INT64_MASK = (1 << 64) - 1
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
_GOLDEN = 0x9E3779B97F4A7C15


def _signed(value: int) -> int:
    """The int64 with the same 64 bits as the unsigned ``value``."""
    value &= _INT64_MASK
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    # torch's >> is arithmetic on int64; masking off the sign-extended bits makes it logical.
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(keys: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Hash int64 keys to well-mixed non-negative int64 values (SplitMix64 finalizer, 63 bits kept).

    Args:
        keys (torch.Tensor): int64 tensor of any shape.
        seed (int): selects an independent hash function; any Python int.

    Returns:
        torch.Tensor: int64 tensor of ``keys``' shape, values in ``[0, 2**63)``.

    Raises:
        TypeError: ``keys`` is not an int64 tensor.

    Example::

        buckets = mix64(torch.tensor([0, 2**63 - 1])) % 1024
    """
    if keys.dtype != torch.int64:
        # builtin TypeError: the dtype contract of the native ops (native/ops.py), which mix64 mirrors
        raise TypeError(f"mix64 hashes int64 keys, got a {keys.dtype} tensor: convert the keys with .long() first")
    z = keys + _signed(_GOLDEN * (seed + 1))
    z = (z ^ _shift_right(z, 30)) * _signed(_MUL1)
    z = (z ^ _shift_right(z, 27)) * _signed(_MUL2)
    z = z ^ _shift_right(z, 31)
    return z & ((1 << 63) - 1)


def uniform(keys: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Map int64 keys to reproducible pseudo-random float64 values in ``[0, 1)``.

    Args:
        keys (torch.Tensor): int64 tensor of any shape.
        seed (int): selects an independent stream.

    Returns:
        torch.Tensor: float64 tensor of ``keys``' shape (53 random bits each).

    Example::

        admit = uniform(keys, seed=7) < 0.25
    """
    return _shift_right(mix64(keys, seed), 10).double() * 2.0**-53

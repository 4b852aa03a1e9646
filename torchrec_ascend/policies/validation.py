"""Checks of what a policy returns, shared by the checked wrapper (every call) and the contract kit (tests).

Each function returns ``None`` when the output is well formed, otherwise one sentence saying what is wrong, with
the offending values; the caller adds who returned it.

Example::

    problem = victims_problem(victims, num=4, capacity=1024, resident=resident, evictable=evictable)
    if problem:
        raise PluginError(f"policy 'lru' select_victims {problem}")
"""

from __future__ import annotations

from typing import Any, Optional

import torch

_SHOW = 8  # offending values quoted in a message


def _quote(values: torch.Tensor) -> str:
    shown = values[:_SHOW].tolist()
    more = f" and {values.numel() - _SHOW} more" if values.numel() > _SHOW else ""
    return f"{shown}{more}"


def slots_problem(slots: Any, capacity: int, resident: torch.Tensor) -> Optional[str]:
    """Problem with a set of slots a policy nominates: 1-D int64, in ``[0, capacity)``, distinct, resident.

    Args:
        slots: what the policy returned.
        capacity (int): number of slots of the pool.
        resident (torch.Tensor): ``[capacity]`` bool, the owner's view of residency.

    Returns:
        Optional[str]: ``None`` if well formed, else a description.
    """
    if not isinstance(slots, torch.Tensor):
        return f"returned a {type(slots).__name__}, expected a 1-D int64 tensor of slots"
    if slots.dtype != torch.int64 or slots.dim() != 1:
        return f"returned a {slots.dim()}-D {slots.dtype} tensor, expected a 1-D int64 tensor of slots"
    if not slots.numel():
        return None
    # Each test is a reduction; the offending slots are gathered only to describe a failure.
    outside = (slots < 0) | (slots >= capacity)
    if bool(outside.any()):
        return f"returned slots {_quote(slots[outside])} outside [0, {capacity})"
    counts = torch.bincount(slots, minlength=capacity)  # O(n + capacity), no sort
    if int(counts.max()) > 1:
        return f"returned slots {_quote((counts > 1).nonzero().squeeze(1))} more than once"
    held = resident.index_select(0, slots)
    if not bool(held.all()):
        return f"returned slots {_quote(slots[~held])} that are not resident"
    return None


def victims_problem(
    victims: Any, num: int, capacity: int, resident: torch.Tensor, evictable: torch.Tensor
) -> Optional[str]:
    """Problem with the output of ``select_victims``: also exactly ``num`` slots, all evictable.

    Args:
        victims: what the policy returned.
        num (int): how many victims were asked for.
        capacity (int): number of slots of the pool.
        resident (torch.Tensor): ``[capacity]`` bool residency.
        evictable (torch.Tensor): ``[capacity]`` bool mask passed to the policy.

    Returns:
        Optional[str]: ``None`` if well formed, else a description.
    """
    problem = slots_problem(victims, capacity, resident)
    if problem:
        return problem
    if victims.numel() != num:
        return f"returned {victims.numel()} victims, expected exactly {num}"
    free = evictable.index_select(0, victims)
    if not bool(free.all()):
        return f"returned slots {_quote(victims[~free])} that are not evictable (in use by an in-flight batch)"
    return None


def victims_ok(victims: Any, num: int, capacity: int, allowed: torch.Tensor) -> bool:
    """Whether :func:`victims_problem` finds nothing, in one pass over the victims (the checked wrapper asks on every
    eviction; :func:`victims_problem` then says what is wrong). Clears the victims from ``allowed``: pass a scratch
    mask.

    Args:
        victims: what the policy returned.
        num (int): how many victims were asked for.
        capacity (int): number of slots of the pool.
        allowed (torch.Tensor): ``[capacity]`` bool, resident and evictable; overwritten.

    Returns:
        bool: True iff ``victims`` is an int64 1-D tensor of exactly ``num`` distinct allowed slots.

    Example::

        assert victims_ok(victims, num, capacity, resident & evictable)
    """
    if not isinstance(victims, torch.Tensor) or victims.dtype != torch.int64 or victims.dim() != 1:
        return False
    if victims.numel() != num or allowed.numel() != capacity:
        return False
    # Imported here: policies load (plugin discovery at `import torchrec`) even where the native library does not.
    from torchrec_ascend.native import ops

    return ops.take_slots(allowed, victims)


def admission_problem(mask: Any, keys: torch.Tensor) -> Optional[str]:
    """Problem with the output of ``admit``: a bool tensor of ``keys``' shape.

    Returns:
        Optional[str]: ``None`` if well formed, else a description.
    """
    if not isinstance(mask, torch.Tensor):
        return f"returned a {type(mask).__name__}, expected a bool tensor of shape {tuple(keys.shape)}"
    if mask.dtype != torch.bool or mask.shape != keys.shape:
        return (
            f"returned a {mask.dtype} tensor of shape {tuple(mask.shape)}, expected a bool tensor of shape "
            f"{tuple(keys.shape)} (one decision per key given)"
        )
    return None


def state_problem(state: Any) -> Optional[str]:
    """Problem with the output of ``state_dict``: a dict from str to tensors.

    Returns:
        Optional[str]: ``None`` if well formed, else a description.
    """
    if not isinstance(state, dict):
        return f"returned a {type(state).__name__}, expected a dict of str -> torch.Tensor"
    bad = [repr(k) for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        return f"returned entries {', '.join(bad[:_SHOW])} that are not str -> torch.Tensor"
    return None

"""Checked wrappers: every call into a plugin's policy is validated before its result reaches the owner.

The cache or table owner only ever holds a wrapped policy (the registry returns one). A wrapper

* turns any exception raised by the policy into a :class:`PluginError` naming the plugin, the method and the
  distribution version (pluggy would re-raise it bare);
* validates every output (dtype, shape, range, distinct, resident, evictable, exactly ``num``) before returning
  it, so a malformed answer is an error and never a corrupted cache;
* tracks residency itself from ``on_insert``/``on_remove``, which is what "resident" is checked against, and
  updates it only after the policy accepted the call.

Costs a few vectorized ops per call and one native pass over the victims, no per-ID Python work.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch

from torchrec_ascend.errors import CapacityError, ConfigError, PluginError
from torchrec_ascend.plugin_manager import PluginInfo, wrap_plugin_call
from torchrec_ascend.policies.base import AdmissionPolicy, EvictionPolicy
from torchrec_ascend.policies.validation import (
    admission_problem,
    slots_problem,
    state_problem,
    victims_ok,
    victims_problem,
)

_POLICY_PREFIX = "policy."


def plugin_origin(info: PluginInfo) -> str:
    """``plugin 'name' (distribution version)`` for messages.

    Example::

        plugin_origin(entry.plugin)  # "plugin 'builtin_policies' (torchrec-ascend 0.1.0)"
    """
    where = f"{info.distribution.strip('()')} {info.version}".strip()
    return f"plugin {info.name!r} ({where})"


def _given(**optional: Any) -> Dict[str, Any]:
    return {k: v for k, v in optional.items() if v is not None}


class _Checked:
    """What both wrappers hold: the plugin's policy, its name and plugin, its methods wrapped to name all three."""

    kind: str  # "eviction" or "admission", for messages

    def _wrap(self, policy: Any, name: str, info: PluginInfo, methods: Tuple[str, ...]) -> None:
        self.policy = policy
        self.policy_name = name
        self.plugin = info
        self._calls: Dict[str, Callable[..., Any]] = {
            m: wrap_plugin_call(info.name, f"{m} of {self.kind} policy {name!r}", info, getattr(policy, m))
            for m in methods
        }

    def _malformed(self, method: str, problem: str) -> PluginError:
        return PluginError(
            f"{self.kind} policy {self.policy_name!r} from {plugin_origin(self.plugin)} {method} "
            f"{problem}. The call was rejected and nothing changed; report it to the plugin's authors or choose "
            f"another policy."
        )

    def _checked_state(self) -> Dict[str, torch.Tensor]:
        state = self._calls["state_dict"]()
        problem = state_problem(state)
        if problem:
            raise self._malformed("state_dict", problem)
        return state


class CheckedEvictionPolicy(_Checked, EvictionPolicy):
    """An :class:`EvictionPolicy` that validates the wrapped policy's every answer.

    Args:
        policy (EvictionPolicy): the plugin's policy object.
        name (str): the name it was created under (for messages).
        info (PluginInfo): the plugin that provided it.

    Raises:
        PluginError: (from any method) the policy raised or returned malformed output.
        CapacityError: (from :meth:`select_victims`) fewer than ``num`` resident slots are evictable.

    Example::

        checked = CheckedEvictionPolicy(LRU(capacity=8), "lru", plugin_info)
        checked.on_insert(torch.tensor([0]), torch.tensor([42]), step=0)
    """

    kind = "eviction"

    def __init__(self, policy: EvictionPolicy, name: str, info: PluginInfo) -> None:
        super().__init__(policy.capacity)
        self.resident = torch.zeros(policy.capacity, dtype=torch.bool)
        methods = ("on_insert", "on_access", "on_remove", "select_victims", "expired", "state_dict", "load_state_dict")
        self._wrap(policy, name, info, methods)

    def on_insert(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        step: int,
        counts: Optional[torch.Tensor] = None,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        # optional arguments are passed only when given, so policies written against the short form keep working
        self._calls["on_insert"](slots, keys, step, **_given(counts=counts, signals=signals))
        self.resident.index_fill_(0, slots, True)

    def on_access(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        counts: torch.Tensor,
        step: int,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        self._calls["on_access"](slots, keys, counts, step, **_given(signals=signals))

    def on_remove(self, slots: torch.Tensor) -> None:
        self._calls["on_remove"](slots)
        self.resident.index_fill_(0, slots, False)

    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        allowed = self.resident & evictable
        available = int(allowed.count_nonzero())
        if num > available:
            raise CapacityError(
                f"cannot evict {num} slots with eviction policy {self.policy_name!r}: only {available} of "
                f"{self.capacity} slots are resident and evictable. The rows in use by in-flight batches do not "
                f"fit: raise the cache capacity or lower the batch size or pipeline depth."
            )
        victims = self._calls["select_victims"](num, evictable, step)
        if not victims_ok(victims, num, self.capacity, allowed):
            problem = victims_problem(victims, num, self.capacity, self.resident, evictable)
            raise self._malformed(f"select_victims(num={num})", str(problem))
        return victims

    def expired(self, step: int) -> torch.Tensor:
        slots = self._calls["expired"](step)
        problem = slots_problem(slots, self.capacity, self.resident)
        if problem:
            raise self._malformed("expired", problem)
        return slots

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """The policy's state under ``"policy."`` plus the residency the wrapper checks against."""
        state = self._checked_state()
        return {"resident": self.resident.clone(), **{_POLICY_PREFIX + k: v for k, v in state.items()}}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        resident = state.get("resident")
        if not isinstance(resident, torch.Tensor) or resident.shape != self.resident.shape:
            raise ConfigError(
                f"eviction policy {self.policy_name!r}: the state to load has no 'resident' mask of shape "
                f"({self.capacity},); load a state_dict saved from a policy with the same name and capacity"
            )
        inner = {k[len(_POLICY_PREFIX) :]: v for k, v in state.items() if k.startswith(_POLICY_PREFIX)}
        self._calls["load_state_dict"](inner)
        self.resident.copy_(resident)


class CheckedAdmissionPolicy(_Checked, AdmissionPolicy):
    """An :class:`AdmissionPolicy` whose answers are validated (a bool mask of the keys' shape).

    Args:
        policy (AdmissionPolicy): the plugin's policy object.
        name (str): the name it was created under (for messages).
        info (PluginInfo): the plugin that provided it.

    Raises:
        PluginError: (from any method) the policy raised or returned malformed output.

    Example::

        checked = CheckedAdmissionPolicy(CountAdmission(threshold=2), "count", plugin_info)
        checked.admit(torch.tensor([5]), torch.tensor([1]), step=0)  # tensor([False])
    """

    kind = "admission"

    def __init__(self, policy: AdmissionPolicy, name: str, info: PluginInfo) -> None:
        super().__init__()
        self._wrap(policy, name, info, ("admit", "forget", "state_dict", "load_state_dict"))

    def admit(
        self,
        keys: torch.Tensor,
        counts: torch.Tensor,
        step: int,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> torch.Tensor:
        mask = self._calls["admit"](keys, counts, step, signals)
        problem = admission_problem(mask, keys)
        if problem:
            raise self._malformed("admit", problem)
        return mask

    def forget(self, keys: torch.Tensor) -> None:
        self._calls["forget"](keys)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return self._checked_state()

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        self._calls["load_state_dict"](state)

"""The policy registry: find installed policies by name, create checked instances, compose eviction policies.

Policies come only from plugins (hook ``torchrec_ascend_policies``, entry-point group ``torchrec_ascend``; the
built-ins are the plugin ``builtin_policies``). Names are lower case (``[a-z][a-z0-9_]*``) and unique per kind
across all plugins; a duplicate is an error naming both plugins.

How table configs choose policies::

    eviction_policy="lfu"                       eviction_options={}                      # defaults
    eviction_policy="ttl"                       eviction_options={"ttl_steps": 1000}     # flat options
    eviction_policy="ttl+lfu"                   eviction_options={"ttl": {"ttl_steps": 1000}, "lfu": {}}
    admission_policy="count"                    admission_options={"threshold": 3}

* A single name takes its options flat, as keyword arguments of the policy's factory.
* ``"a+b+...+z"`` composes eviction policies (see :mod:`torchrec_ascend.policies.compose`: slots expired in any
  component go first, the last component ranks the rest). Options are then keyed by component name, each a
  dict; components without an entry use their defaults. A name may appear once per composite.
* Admission policies do not compose: one name, flat options.

Every unknown name or option is a :class:`ConfigError` that lists what is known and suggests the closest match.
Every created policy is wrapped (:mod:`torchrec_ascend.policies.checked`), so a plugin's mistake surfaces as a
:class:`PluginError` naming the plugin, the method and the distribution version.

Example::

    policy = create_eviction_policy("ttl+lfu", capacity=100_000, ttl={"ttl_steps": 500})
    admission = create_admission_policy("count", threshold=2)
    for entry in list_policies():
        print(entry.kind, entry.name, entry.distribution, entry.version)
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from torchrec_ascend.errors import ConfigError, PluginError
from torchrec_ascend.plugin_manager import BLOCK_ENV, PluginInfo, get_plugin_manager
from torchrec_ascend.policies.base import AdmissionPolicy, EvictionPolicy, PolicyKind, PolicySpec
from torchrec_ascend.policies.checked import CheckedAdmissionPolicy, CheckedEvictionPolicy, plugin_origin
from torchrec_ascend.policies.compose import CompositeEvictionPolicy

HOOK = "torchrec_ascend_policies"
KINDS: Tuple[PolicyKind, ...] = ("eviction", "admission")
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
COMPOSE = "+"


@dataclasses.dataclass(frozen=True)
class PolicyEntry:
    """An installed policy: its spec and the plugin (and distribution) it came from.

    Attributes:
        name (str): the name configs use.
        kind (str): ``"eviction"`` or ``"admission"``.
        description (str): one line for listings.
        factory (Callable): builds the raw (unchecked) policy.
        plugin (PluginInfo): plugin name, distribution, version, module.
    """

    name: str
    kind: PolicyKind
    description: str
    factory: Callable[..., Any]
    plugin: PluginInfo

    @property
    def distribution(self) -> str:
        """Distribution that installed the plugin (``"(registered in-process)"`` for test plugins)."""
        return self.plugin.distribution

    @property
    def version(self) -> str:
        """Version of that distribution."""
        return self.plugin.version

    def option_names(self) -> Optional[List[str]]:
        """Keyword options the factory accepts, or ``None`` when it takes arbitrary ``**options``."""
        try:
            params = inspect.signature(self.factory).parameters.values()
        except (TypeError, ValueError):
            return None
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return [p.name for p in params if p.kind in keyword and p.name != "capacity"]

    def build(self, capacity: Optional[int] = None, **options: Any) -> Any:
        """Create the raw policy (unchecked: the contract kit tests it as is; owners use the ``create_*`` functions).

        Args:
            capacity (int, optional): number of slots; required for eviction policies, refused for admission.
            **options: the policy's options.

        Raises:
            ConfigError: an option the factory does not take, or a value the policy rejects.
            PluginError: the factory raised anything else or returned something that is not a policy.
        """
        accepted = self.option_names()
        unknown = sorted(set(options) - set(accepted)) if accepted is not None else []
        if unknown and accepted is not None:
            hints = [_suggest(u, accepted) for u in unknown]
            raise ConfigError(
                f"{self.kind} policy {self.name!r} does not take option(s) {unknown}"
                f"{''.join(h for h in hints if h)}; it takes: {', '.join(accepted) or 'no options'}"
            )
        try:
            policy = self.factory(capacity=capacity, **options) if self.kind == "eviction" else self.factory(**options)
        except ConfigError:
            raise  # a bad option value: the user's to fix, the message names the policy and option
        except Exception as err:
            raise PluginError(
                f"the factory of {self.kind} policy {self.name!r} from {plugin_origin(self.plugin)} raised "
                f"{type(err).__name__}: {err}"
            ) from err
        expected = EvictionPolicy if self.kind == "eviction" else AdmissionPolicy
        if not isinstance(policy, expected):
            raise PluginError(
                f"the factory of {self.kind} policy {self.name!r} from {plugin_origin(self.plugin)} returned a "
                f"{type(policy).__name__}, not an "
                f"{expected.__name__} subclass"
            )
        return policy


def _suggest(name: str, known: List[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _entries() -> Dict[Tuple[str, str], PolicyEntry]:
    """Every installed policy by ``(kind, name)``, validated."""
    entries: Dict[Tuple[str, str], PolicyEntry] = {}
    for spec, info in get_plugin_manager().collect(HOOK):
        origin = plugin_origin(info)
        if not isinstance(spec, PolicySpec):
            raise PluginError(f"{origin} returned a {type(spec).__name__} from {HOOK}, expected PolicySpec objects")
        if spec.kind not in KINDS or not NAME_PATTERN.fullmatch(spec.name) or not callable(spec.factory):
            raise PluginError(
                f"{origin} returned an invalid PolicySpec {spec.name!r} (kind {spec.kind!r}): the name must match "
                f"{NAME_PATTERN.pattern}, the kind be one of {list(KINDS)}, the factory be callable"
            )
        other = entries.get((spec.kind, spec.name))
        if other is not None:
            raise PluginError(
                f"{spec.kind} policy {spec.name!r} is provided twice: by {plugin_origin(other.plugin)} and by "
                f"{origin}. Uninstall one of them or block one with "
                f"{BLOCK_ENV}={info.name}"
            )
        entries[(spec.kind, spec.name)] = PolicyEntry(spec.name, spec.kind, spec.description, spec.factory, info)
    return entries


def list_policies(kind: Optional[PolicyKind] = None) -> List[PolicyEntry]:
    """Every installed policy (optionally of one kind), sorted by kind then name.

    Raises:
        PluginError: a plugin returned a malformed spec or a name another plugin already uses.

    Example::

        [e.name for e in list_policies("eviction")]  # ['epoch_lfu', 'epoch_lru', 'lfu', 'lru', ...]
    """
    entries = _entries().values()
    return sorted((e for e in entries if kind in (None, e.kind)), key=lambda e: (KINDS.index(e.kind), e.name))


def find_policy(name: str, kind: PolicyKind) -> PolicyEntry:
    """The installed policy ``name`` of ``kind`` (a single name, not a composite).

    Raises:
        ConfigError: no such policy; the message lists the known names and suggests the closest.

    Example::

        find_policy("lru", "eviction").distribution  # 'torchrec-ascend'
    """
    entries = _entries()
    key = name.strip().lower()
    if (kind, key) in entries:
        return entries[(kind, key)]
    known = sorted(n for k, n in entries if k == kind)
    other_kind = [k for k, n in entries if n == key and k != kind]
    hint = f" ({key!r} is an {other_kind[0]} policy)" if other_kind else _suggest(key, known)
    raise ConfigError(
        f"unknown {kind} policy {name!r}{hint}. Installed {kind} policies: {', '.join(known) or 'none'}. "
        f"`torchrec-ascend policies` lists them with their distributions; install the plugin that provides it."
    )


def split_policy_name(name: str) -> List[str]:
    """Component names of ``"a+b"`` (lower-cased, stripped); one element for a plain name.

    Raises:
        ConfigError: an empty component or a repeated one.

    Example::

        split_policy_name("TTL + lfu")  # ['ttl', 'lfu']
    """
    parts = [p.strip().lower() for p in name.split(COMPOSE)]
    if not all(parts):
        raise ConfigError(f"policy name {name!r} has an empty component; write names joined by '+', e.g. 'ttl+lfu'")
    repeated = sorted({p for p in parts if parts.count(p) > 1})
    if repeated:
        raise ConfigError(f"policy name {name!r} repeats {repeated}; each policy may appear once in a composite")
    return parts


def create_eviction_policy(name: str, capacity: int, **options: Any) -> EvictionPolicy:
    """Create the eviction policy ``name`` (or composite ``"a+b"``) for ``capacity`` slots, checked.

    Args:
        name (str): a policy name or a ``+``-joined composite (module docstring).
        capacity (int): number of slots of the cache or table.
        **options: flat options for a single name; ``{component: {option: value}}`` for a composite.

    Returns:
        EvictionPolicy: a :class:`CheckedEvictionPolicy`, or a :class:`CompositeEvictionPolicy` of them.

    Raises:
        ConfigError: unknown name or option, bad option value, or composite options not keyed by component.
        PluginError: the plugin's factory failed.

    Example::

        lru = create_eviction_policy("lru", capacity=1024)
        mixed = create_eviction_policy("ttl+lfu", capacity=1024, ttl={"ttl_steps": 100})
    """
    parts = split_policy_name(name)
    entries = [find_policy(part, "eviction") for part in parts]
    if len(parts) == 1:
        return CheckedEvictionPolicy(entries[0].build(capacity, **options), parts[0], entries[0].plugin)
    stray = sorted(set(options) - set(parts))
    if stray or not all(isinstance(v, dict) for v in options.values()):
        raise ConfigError(
            f"options of composite eviction policy {name!r} must be keyed by component ({', '.join(parts)}), each "
            f"a dict, e.g. {{{parts[0]!r}: {{...}}}}; got keys {sorted(options)}"
            + (f", of which {stray} name no component" if stray else "")
        )
    components = [
        CheckedEvictionPolicy(entry.build(capacity, **options.get(part, {})), part, entry.plugin)
        for part, entry in zip(parts, entries)
    ]
    return CompositeEvictionPolicy(parts, components)


def create_admission_policy(name: str, **options: Any) -> AdmissionPolicy:
    """Create the admission policy ``name``, checked.

    Args:
        name (str): an admission policy name (admission policies do not compose).
        **options: the policy's options.

    Returns:
        AdmissionPolicy: a :class:`CheckedAdmissionPolicy`.

    Raises:
        ConfigError: unknown name or option, bad option value, or a ``+`` composite.
        PluginError: the plugin's factory failed.

    Example::

        admission = create_admission_policy("count", threshold=3)
    """
    if COMPOSE in name:
        raise ConfigError(
            f"admission policy {name!r}: admission policies do not compose with '+'; choose one "
            f"(its options may combine signals, e.g. 'showclick' with alpha and beta)"
        )
    entry = find_policy(name, "admission")
    return CheckedAdmissionPolicy(entry.build(**options), entry.name, entry.plugin)

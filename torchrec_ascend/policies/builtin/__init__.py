"""Built-in policy plugins, registered through the torchrec_ascend entry-point group like any third party.

The distribution's ``pyproject.toml`` names this module as entry point ``builtin_policies``; the plugin manager
loads it and calls :func:`torchrec_ascend_policies`. Nothing imports it directly, so it can be blocked by name
(``TORCHREC_ASCEND_BLOCK_PLUGINS=builtin_policies``) like any other plugin.
"""

from __future__ import annotations

from typing import List

from torchrec_ascend.hookspecs import hookimpl
from torchrec_ascend.policies.base import PolicySpec
from torchrec_ascend.policies.builtin.admission import CountAdmission, ProbabilisticAdmission
from torchrec_ascend.policies.builtin.frequency import LFU, EpochLFU
from torchrec_ascend.policies.builtin.recency import LRU, EpochLRU
from torchrec_ascend.policies.builtin.showclick import ShowClickAdmission, ShowClickEviction
from torchrec_ascend.policies.builtin.ttl import TTL


@hookimpl
def torchrec_ascend_policies() -> List[PolicySpec]:
    """The built-in eviction and admission policies."""
    return [
        PolicySpec("lru", "eviction", LRU, "least recently used step first"),
        PolicySpec("lfu", "eviction", LFU, "fewest accesses since insertion first, then least recent"),
        PolicySpec("epoch_lru", "eviction", EpochLRU, "LRU at the granularity of epochs of steps, oldest insert first"),
        PolicySpec("epoch_lfu", "eviction", EpochLFU, "least recent epoch first, then fewest accesses in that epoch"),
        PolicySpec("ttl", "eviction", TTL, "expires slots idle for ttl_steps or ttl_seconds; longest idle first"),
        PolicySpec("showclick", "eviction", ShowClickEviction, "lowest decayed alpha*show + beta*click first"),
        PolicySpec("count", "admission", CountAdmission, "admit once a key has been seen `threshold` times"),
        PolicySpec("showclick", "admission", ShowClickAdmission, "admit once alpha*show + beta*click >= threshold"),
        PolicySpec("probabilistic", "admission", ProbabilisticAdmission, "admit with probability p (seeded hash)"),
    ]

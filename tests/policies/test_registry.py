"""The policy registry: discovery through the entry point, errors that name and suggest, composition by name."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from spec_plugin import SpecPlugin
from torchrec_ascend.errors import ConfigError, PluginError
from torchrec_ascend.plugin_manager import BLOCK_ENV, reset_plugin_manager
from torchrec_ascend.policies.base import PolicySpec
from torchrec_ascend.policies.builtin.recency import LRU
from torchrec_ascend.policies.checked import CheckedAdmissionPolicy, CheckedEvictionPolicy
from torchrec_ascend.policies.compose import CompositeEvictionPolicy
from torchrec_ascend.policies.registry import (
    create_admission_policy,
    create_eviction_policy,
    find_policy,
    list_policies,
    split_policy_name,
)

BUILTIN_EVICTION = {"lru", "lfu", "epoch_lru", "epoch_lfu", "ttl", "showclick"}
BUILTIN_ADMISSION = {"count", "showclick", "probabilistic"}


def test_builtins_come_from_the_entry_point_with_their_distribution():
    version = importlib.metadata.version("torchrec-ascend")
    builtin = [e for e in list_policies() if e.plugin.name == "builtin_policies"]
    assert {e.name for e in builtin if e.kind == "eviction"} == BUILTIN_EVICTION
    assert {e.name for e in builtin if e.kind == "admission"} == BUILTIN_ADMISSION
    assert {(e.distribution, e.version, e.plugin.module) for e in builtin} == {
        ("torchrec-ascend", version, "torchrec_ascend.policies.builtin")
    }


def test_blocking_the_builtin_plugin_removes_its_policies(monkeypatch):
    monkeypatch.setenv(BLOCK_ENV, "builtin_backends,builtin_policies")
    reset_plugin_manager()
    try:
        assert not [e for e in list_policies() if e.plugin.name == "builtin_policies"]
        with pytest.raises(ConfigError, match="unknown eviction policy 'lru'"):
            create_eviction_policy("lru", 4)
    finally:
        monkeypatch.undo()
        reset_plugin_manager()


def test_unknown_name_lists_known_and_suggests_closest():
    with pytest.raises(ConfigError) as err:
        create_eviction_policy("lur", 4)
    message = str(err.value)
    assert "did you mean 'lru'" in message
    assert all(name in message for name in BUILTIN_EVICTION)


def test_name_of_the_other_kind_says_so():
    with pytest.raises(ConfigError, match="'count' is an admission policy"):
        create_eviction_policy("count", 4)


def test_unknown_option_is_named_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"\['ttl_step'\] \(did you mean 'ttl_steps'\?\); it takes: ttl_steps"):
        create_eviction_policy("ttl", 4, ttl_step=3)


def test_names_are_normalised_and_composites_split():
    assert split_policy_name(" TTL + lfu ") == ["ttl", "lfu"]
    assert find_policy("LRU", "eviction").name == "lru"
    for bad in ("lru+", "lru++lfu", "lru+lru"):
        with pytest.raises(ConfigError):
            split_policy_name(bad)


def test_create_returns_checked_policies():
    assert isinstance(create_eviction_policy("lru", 4), CheckedEvictionPolicy)
    assert isinstance(create_admission_policy("count", threshold=3), CheckedAdmissionPolicy)
    composite = create_eviction_policy("ttl+lfu", 4, ttl={"ttl_steps": 2})
    assert isinstance(composite, CompositeEvictionPolicy)
    assert [c.policy_name for c in composite.components] == ["ttl", "lfu"]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"ttl_steps": 2}, r"keyed by component \(ttl, lfu\).*\['ttl_steps'\] name no component"),
        ({"ttl": 2}, "each a dict"),
        ({"ttl": {"ttl_step": 2}}, "did you mean 'ttl_steps'"),
    ],
)
def test_composite_options_are_keyed_by_component(options, message):
    with pytest.raises(ConfigError, match=message):
        create_eviction_policy("ttl+lfu", 4, **options)


def test_admission_policies_do_not_compose():
    with pytest.raises(ConfigError, match="do not compose"):
        create_admission_policy("count+probabilistic")


def test_duplicate_name_names_both_plugins(register_plugin):
    register_plugin(SpecPlugin([PolicySpec("lru", "eviction", LRU)]), "my_lru_plugin")
    with pytest.raises(PluginError) as err:
        create_eviction_policy("lru", 4)
    message = str(err.value)
    assert "plugin 'builtin_policies' (torchrec-ascend" in message
    assert "plugin 'my_lru_plugin' (registered in-process)" in message
    assert f"{BLOCK_ENV}=" in message


@pytest.mark.parametrize(
    "item, message",
    [
        (PolicySpec("Bad-Name", "eviction", LRU), "must match"),
        (PolicySpec("fine", "caching", LRU), "the kind be one of"),
        ("lru", "expected PolicySpec"),
    ],
)
def test_malformed_specs_name_the_plugin(register_plugin, item, message):
    register_plugin(SpecPlugin([item]), "sloppy_plugin")
    with pytest.raises(PluginError, match=f"'sloppy_plugin'.*{message}"):
        list_policies()


def test_factory_failures_name_plugin_and_distribution(register_plugin):
    def explode(capacity):
        raise RuntimeError("no memory")

    register_plugin(
        SpecPlugin([PolicySpec("exploding", "eviction", explode), PolicySpec("not_a_policy", "eviction", dict)]),
        "factories",
    )
    with pytest.raises(PluginError, match=r"'exploding' from plugin 'factories' \(registered in-process\).*no memory"):
        create_eviction_policy("exploding", 4)
    with pytest.raises(PluginError, match="returned a dict, not an EvictionPolicy"):
        create_eviction_policy("not_a_policy", 4)


def test_third_party_policy_with_kwargs_takes_any_option(register_plugin):
    class Flexible(LRU):
        def __init__(self, capacity, **options):
            super().__init__(capacity)
            self.options = options

    register_plugin(SpecPlugin([PolicySpec("flexible", "eviction", Flexible)]), "flexible_plugin")
    policy = create_eviction_policy("flexible", 4, anything=1)
    assert policy.policy.options == {"anything": 1}
    policy.on_insert(torch.tensor([0]), torch.tensor([7]), step=0)
    assert policy.select_victims(1, torch.ones(4, dtype=torch.bool), 1).tolist() == [0]

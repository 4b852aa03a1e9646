"""The contract kit: every built-in passes it, deliberately broken policies fail it with a useful message."""

from __future__ import annotations

import re

import pytest

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.contract import check_policy

EXAMPLES = 15

BUILTINS = [
    ("lru", None, {}),
    ("lfu", None, {}),
    ("lfu", None, {"history": 64}),
    ("epoch_lru", None, {"epoch_steps": 2}),
    ("epoch_lfu", None, {"epoch_steps": 2}),
    ("ttl", None, {"ttl_steps": 1}),
    ("showclick", "eviction", {"beta": 2.0, "score_decay": 0.9, "evict_percentage": 0.4}),
    ("ttl+lfu", None, {"ttl": {"ttl_steps": 1}}),
    ("count", None, {"threshold": 3, "max_tracked": 8}),
    ("showclick", "admission", {"beta": 1.0, "threshold": 2.0, "max_tracked": 8}),
    ("probabilistic", None, {"probability": 0.5, "seed": 3}),
]


@pytest.mark.parametrize("name, kind, options", BUILTINS, ids=lambda v: str(v))
def test_every_builtin_passes(name, kind, options):
    report = check_policy(name, options=options, kind=kind, examples=EXAMPLES)
    assert report.passed, str(report)
    assert len(report.results) == 6


def test_a_name_of_both_kinds_checks_both():
    report = check_policy("showclick", examples=5)
    assert {r.name.split(":")[0] for r in report.results} == {"eviction", "admission"}


@pytest.mark.parametrize(
    "name, failing, message",
    [
        ("broken_duplicates", "eviction: general workload", r"select_victims\(num=\d\) returned slots \[\d\] more"),
        ("broken_evictable", "eviction: general workload", "not evictable"),
        ("broken_random", "eviction: deterministic", "two fresh instances given the same calls answered differently"),
        ("broken_state", "eviction: state_dict round trip", "returned 0 victims|differs from the original"),
        ("broken_crash", "eviction: general workload", "select_victims raised RuntimeError: boom"),
        ("broken_shape", "admission: general workload", r"returned a torch.bool tensor of shape \(\d+,\)"),
        ("broken_admission_state", "admission: state_dict round trip", "state_dict must hold everything"),
    ],
)
def test_broken_policies_fail_with_a_useful_message(broken_plugin, name, failing, message):
    report = check_policy(name, examples=EXAMPLES, checks=[failing.split(": ")[1]])
    assert not report.passed
    (result,) = report.results
    assert result.name == failing
    assert not result.passed and result.example.startswith(("[Step(", "([Step("))
    assert re.search(message, result.message), result.message
    text = str(report)
    assert "FAIL" in text and "falsifying example" in text


def test_a_broken_policy_passes_the_checks_it_does_not_break(broken_plugin):
    report = check_policy("broken_random", examples=EXAMPLES, checks=["general workload", "huge IDs"])
    assert report.passed, str(report)


def test_unknown_policy_option_or_check_fails_before_any_check():
    with pytest.raises(ConfigError, match="did you mean 'lru'"):
        check_policy("lrux")
    with pytest.raises(ConfigError, match="does not take option"):
        check_policy("lru", options={"size": 3})
    with pytest.raises(ConfigError, match="the checks are: general workload"):
        check_policy("lru", checks=["speed"])

"""``torchrec-ascend policies`` and ``torchrec-ascend cache-sim``, driven through their own parsers."""

from __future__ import annotations

import argparse
import json

from spec_plugin import SpecPlugin
from torchrec_ascend.cli import cache_sim, policies
from torchrec_ascend.policies.base import PolicySpec
from torchrec_ascend.policies.builtin.recency import LRU


def _run(module, argv):
    parser = argparse.ArgumentParser()
    module.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.run(args)


def test_policies_lists_name_kind_distribution_version(capsys):
    assert _run(policies, ["policies"]) == 0
    out = capsys.readouterr().out
    header, *rows = out.splitlines()
    assert header.split()[:5] == ["NAME", "KIND", "DISTRIBUTION", "VERSION", "PLUGIN"]
    assert any(r.split()[:3] == ["lru", "eviction", "torchrec-ascend"] for r in rows)
    assert any(r.split()[:3] == ["count", "admission", "torchrec-ascend"] for r in rows)


def test_policies_json_and_kind_filter(capsys):
    assert _run(policies, ["policies", "--kind", "admission", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert {row["kind"] for row in table} == {"admission"}
    assert {"count", "probabilistic", "showclick"} <= {row["name"] for row in table}


def test_policies_reports_a_broken_plugin_and_exits_1(register_plugin, capsys):
    register_plugin(SpecPlugin([PolicySpec("lru", "eviction", LRU)]), "clashing_plugin")
    assert _run(policies, ["policies"]) == 1
    assert "provided twice" in capsys.readouterr().err


def test_cache_sim_prints_tables_and_writes_the_plot(tmp_path, capsys):
    png = tmp_path / "sim.png"
    argv = ["cache-sim", "--trace", "zipf", "drift", "--accesses", "4000", "--keys", "500", "--batch-size", "64",
            "--cache-fractions", "0.01,0.2,0.5", "--policies", "lru,ttl+lfu",
            "--options", '{"ttl+lfu": {"ttl": {"ttl_steps": 5}}}', "--plot", str(png)]  # fmt: skip
    assert _run(cache_sim, argv) == 0
    out = capsys.readouterr().out
    assert "trace zipf" in out and "trace drift" in out and "ttl+lfu" in out
    assert "dropped: below the" in out  # 1% of the keys cannot hold a batch
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cache_sim_rejects_bad_options_with_exit_1(capsys):
    assert _run(cache_sim, ["cache-sim", "--options", "{not json", "--plot", ""]) == 1
    assert "--options is not valid JSON" in capsys.readouterr().err
    assert _run(cache_sim, ["cache-sim", "--policies", "lru", "--options", '{"lfu": {}}', "--plot", ""]) == 1
    assert "not simulated" in capsys.readouterr().err
    assert _run(cache_sim, ["cache-sim", "--policies", "lur", "--accesses", "100", "--keys", "10", "--plot", ""]) == 1
    assert "did you mean 'lru'" in capsys.readouterr().err

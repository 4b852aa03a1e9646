"""Cache simulator: batching and next uses against Python references, Belady's optimality, the traces."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.errors import ConfigError, StorageError
from torchrec_ascend.policies.registry import create_eviction_policy
from torchrec_ascend.policies.simulator import belady_policy, frequency_oracle_policy, plot, prepare, replay, simulate
from torchrec_ascend.policies.traces import drifting_trace, make_trace, movielens_trace, zipf_trace

traces = st.lists(st.one_of(st.integers(0, 12), st.just(2**63 - 1)), min_size=1, max_size=60)


def python_batches(trace, batch_size):
    return [sorted(set(trace[i : i + batch_size])) for i in range(0, len(trace), batch_size)]


def python_belady_hits(trace, batch_size, capacity):
    batches = python_batches(trace, batch_size)
    resident, hits = set(), 0
    for b, keys in enumerate(batches):
        hits += len(resident & set(keys))
        missing = [k for k in keys if k not in resident]
        overflow = len(resident) + len(missing) - capacity
        if overflow > 0:
            later = batches[b + 1 :]
            next_use = {k: next((j for j, ks in enumerate(later) if k in ks), len(later)) for k in resident}
            others = sorted(resident - set(keys), key=next_use.__getitem__, reverse=True)
            resident -= set(others[:overflow])
        resident |= set(missing)
    return hits


@settings(deadline=None)
@given(trace=traces, batch_size=st.integers(1, 7))
def test_prepare_matches_python_batching(trace, batch_size):
    batches = prepare(torch.tensor(trace, dtype=torch.int64), batch_size)
    expected = python_batches(trace, batch_size)
    assert batches.num_batches == len(expected)
    for b, keys in enumerate(expected):
        lo, hi = int(batches.offsets[b]), int(batches.offsets[b + 1])
        assert batches.keys[lo:hi].tolist() == keys
        chunk = trace[b * batch_size : (b + 1) * batch_size]
        assert batches.counts[lo:hi].tolist() == [chunk.count(k) for k in keys]
        following = [next((j for j in range(b + 1, len(expected)) if k in expected[j]), len(expected)) for k in keys]
        assert batches.next_use[lo:hi].tolist() == following


@settings(deadline=None)
@given(trace=traces, batch_size=st.integers(1, 4), extra=st.integers(0, 4))
def test_belady_matches_python_reference_and_beats_every_builtin(trace, batch_size, extra):
    batches = prepare(torch.tensor(trace, dtype=torch.int64), batch_size)
    capacity = batches.max_batch_keys + extra
    best = replay(batches, belady_policy(capacity, batches)).hits
    assert best == python_belady_hits(trace, batch_size, capacity)
    assert replay(batches, frequency_oracle_policy(capacity, batches)).hits <= best
    for name, options in [("lru", {}), ("lfu", {}), ("epoch_lfu", {"epoch_steps": 2}), ("showclick", {})]:
        assert replay(batches, create_eviction_policy(name, capacity, **options)).hits <= best


@settings(deadline=None)
@given(trace=traces, capacity=st.integers(1, 6))
def test_lru_with_single_access_batches_matches_ordered_dict(trace, capacity):
    cache, hits = OrderedDict(), 0
    for key in trace:
        if key in cache:
            hits += 1
            cache.move_to_end(key)
        else:
            if len(cache) == capacity:
                cache.popitem(last=False)
            cache[key] = True
    result = replay(prepare(torch.tensor(trace, dtype=torch.int64), 1), create_eviction_policy("lru", capacity))
    assert (result.hits, result.lookups) == (hits, len(trace))


def test_cache_smaller_than_a_batch_is_a_config_error():
    with pytest.raises(ConfigError, match="smaller than the 3 distinct keys of the largest batch"):
        replay(prepare(torch.tensor([1, 2, 3]), 3), create_eviction_policy("lru", 2))


def test_simulate_report_table_ratios_and_plot(tmp_path):
    trace = zipf_trace(3000, 300, seed=1)
    report = simulate(trace, 50, [60, 120], {"lru": {}, "lfu": {}, "ttl": {}}, label="zipf")
    assert report.policies() == ["belady", "oracle_lfu", "lru", "lfu"]
    assert any("skipped ttl" in note for note in report.notes)
    for capacity in (60, 120):
        assert report.ratio("belady", capacity) == 1.0
        assert 0 < report.ratio("lfu", capacity) <= 1.0
        assert 0 < report.ratio("oracle_lfu", capacity) <= 1.0
    with pytest.raises(ConfigError, match=r"'ttl' was not simulated at capacity 60; .* capacities \[60, 120\]"):
        report.ratio("ttl", 60)
    table = report.table()
    assert table.startswith("trace zipf:") and "cache 60" in table and "lru" in table and "skipped ttl" in table
    plot([report, report], str(tmp_path / "sim.png"))
    assert (tmp_path / "sim.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_zipf_trace_is_seeded_and_skewed():
    a, b = zipf_trace(20_000, 1000, alpha=1.0, seed=3), zipf_trace(20_000, 1000, alpha=1.0, seed=3)
    assert torch.equal(a, b) and not torch.equal(a, zipf_trace(20_000, 1000, seed=4))
    _, counts = torch.unique(a, return_counts=True)
    top = torch.sort(counts, descending=True).values
    assert top[0] > 5 * top[50]  # rank 1 vs rank 51: expected ratio 51 under Zipf(1)


def test_drifting_trace_moves_its_hot_set():
    trace = drifting_trace(40_000, 2000, phases=4, seed=0)
    first, last = trace[:10_000], trace[-10_000:]

    def hot(part):
        keys, counts = torch.unique(part, return_counts=True)
        return set(keys[torch.topk(counts, 20).indices].tolist())

    assert len(hot(first) & hot(last)) < 5
    with pytest.raises(ConfigError, match="unknown trace"):
        make_trace("nope")


def test_movielens_trace_keeps_each_users_order():
    try:
        trace = movielens_trace()
    except StorageError as err:
        pytest.skip(f"MovieLens-100K is not available offline here: {err}")
    from torchrec_ascend.datasets import load_movielens_100k

    data = load_movielens_100k()
    assert trace.numel() == len(data) == 100_000
    assert torch.equal(torch.sort(trace).values, torch.sort(data.item).values)
    assert torch.equal(trace, movielens_trace())
    # round 0 is every user's earliest rating, round 1 every second one (users with 2+ ratings), ...
    history = {}
    for user, item in zip(data.chronological().user.tolist(), data.chronological().item.tolist()):
        history.setdefault(user, []).append(item)
    rounds = [sorted(h[r] for h in history.values() if len(h) > r) for r in range(2)]
    assert sorted(trace[: len(rounds[0])].tolist()) == rounds[0]
    assert sorted(trace[len(rounds[0]) : len(rounds[0]) + len(rounds[1])].tolist()) == rounds[1]

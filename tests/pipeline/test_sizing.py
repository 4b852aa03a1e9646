"""Depth and host-thread validation, and the depth reaching kernels (a stand-in KEY_VALUE kernel refuses)."""

from __future__ import annotations

from typing import List

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.errors import CapacityError, ConfigError
from torchrec_ascend.pipeline import HybridTrainPipelineSparseDist, sizing


class StandInKernel(torch.nn.Module):
    """What a KEY_VALUE kernel does with the depth: pin that many batches' rows, or refuse if the cache is too small."""

    def __init__(self, cache_rows: int, rows_per_batch: int) -> None:
        super().__init__()
        self.cache_rows, self.rows_per_batch = cache_rows, rows_per_batch
        self.depths: List[int] = []

    def set_pipeline_depth(self, depth: int) -> None:
        if depth * self.rows_per_batch > self.cache_rows:
            raise CapacityError(
                f"cache of {self.cache_rows} rows cannot pin {depth} batches of {self.rows_per_batch} rows"
            )
        self.depths.append(depth)


class TableHolder:
    """A kernel object kept outside the module tree, as ``emb_module`` (not an nn.Module)."""

    def __init__(self) -> None:
        self.depths: List[int] = []

    def set_pipeline_depth(self, depth: int) -> None:
        self.depths.append(depth)


class Lookup(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb_module = TableHolder()


class Model(torch.nn.Module):
    def __init__(self, cache_rows: int) -> None:
        super().__init__()
        self.sparse = torch.nn.ModuleDict({"kv": StandInKernel(cache_rows, rows_per_batch=100)})
        self.lookup = Lookup()
        self.dense = torch.nn.Linear(2, 1)


def build(model: torch.nn.Module, depth: int) -> HybridTrainPipelineSparseDist:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return HybridTrainPipelineSparseDist(model, optimizer, torch.device("cpu"), pipe_n_batch=depth)


def test_kernel_refusing_the_depth_stops_construction_with_its_reason() -> None:
    with pytest.raises(ConfigError) as info:
        build(Model(cache_rows=250), depth=3)
    message = str(info.value)
    assert "pipe_n_batch=3 was refused by StandInKernel at 'sparse.kv'" in message
    assert "cache of 250 rows cannot pin 3 batches of 100 rows" in message
    assert "Lower pipe_n_batch" in message
    assert isinstance(info.value.__cause__, CapacityError)


def test_every_kernel_is_told_the_depth() -> None:
    model = Model(cache_rows=250)
    pipeline = build(model, depth=2)
    assert model.sparse["kv"].depths == [2]
    assert model.lookup.emb_module.depths == [2]
    assert pipeline.depth_configured == ["sparse.kv", "lookup.emb_module"]
    assert pipeline.pipe_n_batch == 2


@pytest.mark.parametrize("depth", [0, 13, -1, 2.0, "3", True, None])
def test_invalid_depth_is_refused(depth: object) -> None:
    with pytest.raises(ConfigError, match=r"pipe_n_batch=.* is invalid; it must be an integer from 1"):
        build(torch.nn.Linear(2, 1), depth)  # type: ignore[arg-type]  # a bad value on purpose


@pytest.mark.parametrize("depth", [1, 12])
def test_depth_bounds_are_accepted(depth: int) -> None:
    assert build(torch.nn.Linear(2, 1), depth).pipe_n_batch == depth


def test_host_threads_argument_beats_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sizing.HOST_THREADS_ENV, "5")
    assert sizing.host_threads(2) == 2
    assert sizing.host_threads(None) == 5


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_bad_environment_value_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(sizing.HOST_THREADS_ENV, value)
    with pytest.raises(ConfigError, match=sizing.HOST_THREADS_ENV):
        sizing.host_threads(None)


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_bad_host_threads_argument_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="host_threads="):
        sizing.host_threads(value)  # type: ignore[arg-type]  # a bad value on purpose


@settings(deadline=None)
@given(cores=st.integers(1, 256), ranks=st.integers(1, 16), intra=st.integers(1, 32))
def test_default_pool_leaves_intra_op_cores_to_compute(cores: int, ranks: int, intra: int) -> None:
    threads = sizing.default_host_threads(cores, ranks, intra)
    share = cores // ranks
    assert 1 <= threads <= sizing.MAX_DEFAULT_HOST_THREADS
    if share > intra:  # cores left after compute's intra-op threads: use them (up to the cap), never more
        assert threads + intra <= share
        assert threads == min(sizing.MAX_DEFAULT_HOST_THREADS, share - intra)
    assert sizing.default_host_threads(cores + ranks, ranks, intra) >= threads  # more cores never shrink the pool

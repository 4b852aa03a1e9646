"""Shared test configuration: hypothesis profiles (select with HYPOTHESIS_PROFILE=ci|dev), a one-rank process group."""

import os
import tempfile
from typing import Iterator

import pytest
import torch.distributed as dist
from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, max_examples=50, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=20)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    """A gloo process group of one rank (the default group) for the module's tests; use with
    ``pytestmark = pytest.mark.usefixtures("one_rank_group")``."""
    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("gloo", store=dist.FileStore(store, 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()

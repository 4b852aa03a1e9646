"""Shared test configuration: hypothesis profiles (select with HYPOTHESIS_PROFILE=ci|dev)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, max_examples=50, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=20)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

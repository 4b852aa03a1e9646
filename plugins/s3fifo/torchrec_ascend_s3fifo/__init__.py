"""torchrec-ascend-s3fifo: an example third-party plugin providing the ``s3fifo`` eviction policy.

Registered only through the entry point ``s3fifo`` of group ``torchrec_ascend`` (see ``pyproject.toml``).
"""

from __future__ import annotations

from typing import List

from torchrec_ascend.hookspecs import hookimpl
from torchrec_ascend.policies.base import PolicySpec
from torchrec_ascend_s3fifo.policy import S3FIFO

__all__ = ["S3FIFO", "torchrec_ascend_policies"]


@hookimpl
def torchrec_ascend_policies() -> List[PolicySpec]:
    """The S3-FIFO eviction policy."""
    return [PolicySpec("s3fifo", "eviction", S3FIFO, "S3-FIFO: small FIFO probation queue, main CLOCK queue, ghost")]

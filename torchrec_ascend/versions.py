"""The version table: each supported TorchRec minor, the torch, fbgemm and torch-npu it pairs with, and its CI lane.

Every patch declares the TorchRec (and, where it matters, fbgemm) versions it supports with :data:`TORCHREC` or
:data:`TORCHREC_FBGEMM`, both derived from :data:`STACKS`; ``constraints/<lane>.txt`` pins each row's stack for
``scripts/setup-env`` and CI (a test checks that file and its row agree); ``torchrec-ascend doctor`` prints the
row matching the installed TorchRec. Adding a TorchRec minor means one row here, the reviewed digests of every patch
target on it (:mod:`torchrec_ascend.hooks.reviewed`), and one CI lane (its constraints file).

Policy for an installed TorchRec NEWER than the table (torchrec-ascend older than your TorchRec): a patch is applied
only if its target's source is byte-identical to a reviewed version of it (its digest is in the reviewed data file);
the others are skipped and reported by name with the reason, and one warning says so. ``doctor`` then lists each
patch as applied (with the reviewed digest it matched) or skipped (drifted), and exits 1 while any is skipped. For a
TorchRec OLDER than the table, every patch is skipped (its range says so). Within the table a patch always applies;
``doctor`` shows "drifted" for a target that differs from what was reviewed, and the drift test fails in CI.

Example::

    from torchrec_ascend import versions
    versions.TORCHREC                       # {'torchrec': '>=1.8.0,<1.10'}
    versions.stack_for("1.9.2").torch       # '2.14'
    versions.stack_for("1.10.0")            # None: newer than the table
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

from packaging.version import Version


@dataclasses.dataclass(frozen=True)
class Stack:
    """One supported TorchRec minor and what it pairs with.

    Attributes:
        torchrec: the TorchRec minor (``"1.9"``); every patch release of it is supported.
        reviewed: the TorchRec release whose patch targets were reviewed and whose digests are recorded.
        torch: the torch minor fbgemm is built against (fbgemm's own compatibility table; its ABI agrees).
        fbgemm: the fbgemm-gpu / fbgemm-gpu-cpu release TorchRec's release pins.
        torch_npu: the torch-npu release for that torch (torch-npu pins ``torch==<it>.*``).
        lane: the CI lane and constraints file (``constraints/<lane>.txt``) that install this stack.
        ci: True if CI runs the full suite on this stack; False: bound (pins resolve) but not run in CI.
    """

    torchrec: str
    reviewed: str
    torch: str
    fbgemm: str
    torch_npu: str
    lane: str
    ci: bool = True

    def covers(self, version: str) -> bool:
        """True if ``version`` is a release of this TorchRec minor."""
        return Version(version).release[:2] == Version(self.torchrec).release[:2]


#: The supported stacks, oldest first.
STACKS: Tuple[Stack, ...] = (
    Stack(torchrec="1.8", reviewed="1.8.0", torch="2.13", fbgemm="1.8.0", torch_npu="2.13.0", lane="tr18"),
    Stack(torchrec="1.9", reviewed="1.9.2", torch="2.14", fbgemm="1.9.0", torch_npu="2.14.0", lane="tr19"),
)


def _minor_after(minor: str) -> str:
    major, minor_number = Version(minor).release[:2]
    return f"{major}.{minor_number + 1}"


def supported_range(field: str = "torchrec") -> str:
    """The PEP 440 range covering every row's ``torchrec`` (or ``fbgemm``) minor: ``">=1.8.0,<1.10"``."""
    minors = [Version(getattr(s, field)).release[:2] for s in STACKS]
    low, high = min(minors), max(minors)
    return f">={low[0]}.{low[1]}.0,<{_minor_after(f'{high[0]}.{high[1]}')}"


#: What a patch declares when it supports every TorchRec of the table.
TORCHREC: Dict[str, str] = {"torchrec": supported_range()}
#: For patches that also depend on fbgemm's CPU ops behaving as in the paired fbgemm (row-wise sharding on CPU
#: needs its block_bucketize_sparse_features and TBE; the CPU and CUDA builds are different distributions).
TORCHREC_FBGEMM: Dict[str, str] = {**TORCHREC, "fbgemm-gpu|fbgemm-gpu-cpu": supported_range("fbgemm")}


def stack_for(torchrec_version: str) -> Optional[Stack]:
    """The row of the installed TorchRec's minor, or None (older or newer than the table)."""
    return next((s for s in STACKS if s.covers(torchrec_version)), None)


def newer_than_table(torchrec_version: str) -> bool:
    """True if ``torchrec_version`` is newer than every row (the reviewed-digest policy applies)."""
    return Version(torchrec_version).release[:2] > max(Version(s.torchrec).release[:2] for s in STACKS)

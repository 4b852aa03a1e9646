"""Hash tables inside stock TorchRec modules (filled in with the hash-table kernels)."""

from __future__ import annotations

PATCHES: list = []

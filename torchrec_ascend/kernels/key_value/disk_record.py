"""The on-disk record of the KEY_VALUE disk store: key, checksum and the row's exact bytes, in 64-bit words.

Layout of one record (little-endian), ``8 * words`` bytes::

    word 0        the key (int64)
    word 1        the checksum
    words 2..     the row's bytes, zero-padded to a multiple of 8

The checksum is ``SEED + (location + 1) * M_loc + sum_j word_j * M_j (mod 2**64)`` over every word but the checksum
itself, with a fixed odd multiplier ``M_j`` per position. An odd multiplier is invertible modulo 2**64, so any
change confined to one word (every single-bit flip) changes the sum; position-dependent multipliers catch swapped
words; the record's location in the store (a number the store gives each record place) binds it to its place, so
a record copied or moved elsewhere (shuffled, duplicated) fails too; the nonzero ``SEED`` makes an all-zero record
(a hole in a sparse or zero-filled file) invalid. It is computed for a whole batch with one uint64 matrix-vector
product (wrapping arithmetic, defined in numpy). It detects corruption, not tampering.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from torchrec_ascend.native.memory import plain_empty

SEED = np.uint64(0x9E3779B97F4A7C15)
LOCATION_MULTIPLIER = np.uint64(0xD6E8FEB86659FD93)
_MASK = (1 << 64) - 1


def multipliers(words: int) -> np.ndarray:
    """The fixed odd multiplier of each word position (splitmix64 sequence); 0 for the checksum word.

    Example::

        multipliers(4)[1]  # 0
    """
    state, out = 0x243F6A8885A308D3, []
    for _ in range(words):
        state = (state + 0x9E3779B97F4A7C15) & _MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        out.append((z ^ (z >> 31)) | 1)
    mults = np.array(out, dtype=np.uint64)
    mults[1] = 0
    return mults


class RecordFormat:
    """Encodes and checks records for rows of ``width`` elements of ``dtype``.

    Args:
        width (int): elements per row.
        dtype (torch.dtype): element type; rows are stored as raw bytes, never converted.

    Attributes:
        words (int): 64-bit words per record.
        nbytes (int): bytes per record.

    Example::

        fmt = RecordFormat(width=3, dtype=torch.float32)
        records = fmt.encode(torch.tensor([7]), torch.tensor([[1.0, -0.0, float("nan")]]))
        fmt.damaged(records, torch.tensor([7]))  # array([False])
        fmt.decode(records)  # the same bytes back
        fmt.seal(records, np.array([5]))  # the same record, stored at location 5
    """

    def __init__(self, width: int, dtype: torch.dtype) -> None:
        self.width = width
        self.dtype = dtype
        self.row_bytes = width * torch.empty(0, dtype=dtype).element_size()
        self.words = 2 + -(-self.row_bytes // 8)
        self.nbytes = 8 * self.words
        self._multipliers = multipliers(self.words)

    def checksums(self, records: np.ndarray, locations: Optional[np.ndarray] = None) -> np.ndarray:
        """Checksum of each record, uint64 ``[n]``, from records uint64 ``[n, words]`` stored at ``locations``
        (int64 ``[n]``; ``None``: location 0 each)."""
        sums = records @ self._multipliers + SEED
        if locations is not None:
            sums += (locations.astype(np.uint64) + np.uint64(1)) * LOCATION_MULTIPLIER
        else:
            sums += LOCATION_MULTIPLIER
        return sums

    def encode(
        self,
        keys: torch.Tensor,
        rows: torch.Tensor,
        locations: Optional[np.ndarray] = None,
        sealed: bool = True,
        out: Optional[np.ndarray] = None,
    ) -> np.ndarray:
        """Records for ``keys`` (int64 ``[n]``) and ``rows`` (contiguous ``[n, width]``) stored at ``locations``
        (see :meth:`checksums`): uint64 ``[n, words]``, in the first ``n`` rows of ``out`` when given (a buffer
        reused by a caller that encodes many pieces). ``sealed=False`` leaves the checksum word 0, for a caller that
        seals them once their locations are known (the disk store's appends: one checksum pass, not two)."""
        shape = (keys.numel(), self.words)
        records = np.empty(shape, dtype=np.uint64) if out is None else out[: shape[0]]
        records[:, 0] = keys.numpy().view(np.uint64)
        records[:, 1] = 0
        payload = records.view(np.uint8)[:, 16:]
        payload[:, : self.row_bytes] = rows.view(torch.uint8).numpy()
        payload[:, self.row_bytes :] = 0
        return self.seal(records, locations) if sealed else records

    def seal(self, records: np.ndarray, locations: Optional[np.ndarray] = None) -> np.ndarray:
        """Set the checksum of ``records`` (in place) for storing them at ``locations``; returns ``records``."""
        records[:, 1] = self.checksums(records, locations)
        return records

    def damaged(self, records: np.ndarray, keys: torch.Tensor, locations: Optional[np.ndarray] = None) -> np.ndarray:
        """Bool ``[n]``: the record fails its checksum (at ``locations``) or holds another key than expected."""
        wrong_key = records[:, 0] != keys.numpy().view(np.uint64)
        return (records[:, 1] != self.checksums(records, locations)) | wrong_key

    def decode(self, records: np.ndarray) -> torch.Tensor:
        """The rows of ``records`` as a new tensor ``[n, width]`` of the format's dtype."""
        payload = plain_empty((records.shape[0], self.row_bytes), np.uint8)  # reused inside reused_buffers: no faults
        payload[...] = records.view(np.uint8)[:, 16 : 16 + self.row_bytes]
        return torch.from_numpy(payload).view(self.dtype)

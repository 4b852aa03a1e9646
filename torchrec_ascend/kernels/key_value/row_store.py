"""The row-store contract shared by the KEY_VALUE kernel's host and disk tiers, and the checks both apply.

A row store maps raw int64 IDs (``0 .. 2**63-1``) to rows: fixed-width vectors of one dtype (embedding weights
followed by their optimizer state). Every method takes a whole batch of keys as a 1-D CPU tensor; stores return
exactly the bytes they were given (NaN payloads and signed zeros included), because the kernel's transparency
oracle compares training bit for bit.
"""

from __future__ import annotations

from typing import Dict, Iterator, Optional, Protocol, Tuple, runtime_checkable

import torch

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.native import ops


@runtime_checkable
class RowStore(Protocol):
    """What the KEY_VALUE kernel needs from a tier below its device cache.

    Keys are a 1-D int64 CPU tensor ``[n]``; rows are a CPU tensor ``[n, width]`` of the store's dtype.

    * ``put(keys, rows)``: insert or overwrite; if a key repeats, its last row wins.
    * ``get(keys) -> (rows, found)``: copies of the rows (zeros where ``found`` is false); repeats allowed.
    * ``pop(keys) -> (rows, found)``: ``get`` followed by ``remove``.
    * ``remove(keys)``: forget the keys; absent keys are ignored.
    * ``chunks(rows_per_chunk)``: every ``(keys, rows)`` once, in chunks (checkpoints).
    * ``keys(rows_per_chunk)``: the keys of ``chunks``, in its order and blocks, rows left unread or undecoded.

    Example::

        def save(store: RowStore) -> None:
            for keys, rows in store.chunks(65536):
                ...
    """

    width: int
    dtype: torch.dtype

    def put(self, keys: torch.Tensor, rows: torch.Tensor) -> None: ...

    def get(self, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]: ...

    def pop(self, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]: ...

    def remove(self, keys: torch.Tensor) -> None: ...

    def chunks(self, rows_per_chunk: int = ...) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]: ...

    def keys(self, rows_per_chunk: int = ...) -> Iterator[torch.Tensor]: ...

    def stats(self) -> Dict[str, int]: ...

    def close(self) -> None: ...

    def __len__(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


def check_keys(keys: torch.Tensor, where: str) -> torch.Tensor:
    """Validate a batch of keys and return it contiguous.

    Args:
        keys: 1-D int64 CPU tensor ``[n]`` of raw IDs, each in ``0 .. 2**63-1``.
        where: names the store in messages, for example ``"host store of table 'user_id'"``.

    Returns:
        torch.Tensor: ``keys``, contiguous.

    Raises:
        ConfigError: wrong type, dtype, shape or device, or a negative key.

    Example::

        keys = check_keys(torch.tensor([3, 7]), "disk store 't0'")
    """
    if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64 or keys.dim() != 1:
        got = f"{keys.dtype} tensor of shape {tuple(keys.shape)}" if isinstance(keys, torch.Tensor) else type(keys)
        raise ConfigError(
            f"{where}: keys must be a 1-D torch.int64 tensor, got {got}; convert with keys.long().flatten()"
        )
    if keys.device.type != "cpu":
        raise ConfigError(f"{where}: keys must be on the CPU, got device {keys.device}; call keys.cpu() first")
    if keys.numel() and int(keys.min()) < 0:  # one reduction, no mask: this runs on every put, get and pop
        bad = keys[keys < 0][:5].tolist()
        raise ConfigError(f"{where}: keys are raw IDs in 0 .. 2**63-1, got negative keys {bad}; hash or offset them")
    return keys.contiguous()


def check_rows(rows: torch.Tensor, num_keys: int, width: int, dtype: torch.dtype, where: str) -> torch.Tensor:
    """Validate the rows of a ``put`` against its keys and the store's row format; return them contiguous.

    Args:
        rows: CPU tensor ``[num_keys, width]`` of ``dtype``.
        num_keys: number of keys in the same call.
        width: the store's row width (embedding dim + optimizer-state width).
        dtype: the store's dtype.
        where: names the store in messages.

    Returns:
        torch.Tensor: ``rows``, detached and contiguous.

    Raises:
        ConfigError: wrong type, dtype, shape or device. Rows are never cast: a cast would change the bytes.

    Example::

        rows = check_rows(torch.zeros(2, 8), 2, 8, torch.float32, "disk store 't0'")
    """
    if not isinstance(rows, torch.Tensor):
        raise ConfigError(f"{where}: rows must be a torch.Tensor, got {type(rows)}")
    if tuple(rows.shape) != (num_keys, width):
        raise ConfigError(
            f"{where}: rows must have shape [num_keys, width] = [{num_keys}, {width}], got {tuple(rows.shape)}; "
            f"a row is the embedding followed by its optimizer state"
        )
    if rows.dtype != dtype:
        raise ConfigError(
            f"{where}: rows must be {dtype}, got {rows.dtype}; the store keeps exact bytes, so cast first"
        )
    if rows.device.type != "cpu":
        raise ConfigError(f"{where}: rows must be on the CPU, got device {rows.device}; copy them with rows.cpu()")
    return rows.detach().contiguous()  # weights may require grad: the store keeps values, never graph edges


def last_occurrence(keys: torch.Tensor) -> Optional[torch.Tensor]:
    """Positions of the last occurrence of each distinct key, or ``None`` when ``keys`` has no repeats.

    ``put`` uses it so that a repeated key behaves like repeated assignment: the last row wins.

    Args:
        keys: 1-D int64 tensor ``[n]``.

    Returns:
        Optional[torch.Tensor]: int64 positions ``[m]``, ``m`` = number of distinct keys, increasing; ``None`` if
        ``m == n``.

    Example::

        last_occurrence(torch.tensor([5, 6, 5]))  # tensor([1, 2])
        last_occurrence(torch.tensor([5, 6]))  # None
    """
    unique, inverse, _ = ops.hash_unique(keys)  # one hash pass: most batches of keys hold no repeat
    if unique.numel() == keys.numel():
        return None
    positions = torch.arange(keys.numel(), dtype=torch.int64)
    last = torch.full((unique.numel(),), -1, dtype=torch.int64).scatter_reduce_(0, inverse, positions, "amax")
    return last.sort().values


def tensor_nbytes(*tensors: torch.Tensor) -> int:
    """Bytes held by the elements of ``tensors`` (their ``numel * element_size``).

    Example::

        tensor_nbytes(torch.zeros(4, 2), torch.zeros(3, dtype=torch.int64))  # 56
    """
    return sum(t.numel() * t.element_size() for t in tensors)

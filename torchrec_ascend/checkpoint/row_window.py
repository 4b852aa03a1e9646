"""A tensor that stands for a window of a table's rows kept elsewhere: read when used, written through when copied into.

A KEY_VALUE table's rows live in a device cache, host memory and disk, keyed by ID; TorchRec's stock ``state_dict()``
and ``torch.distributed.checkpoint`` (DCP) expect tensors. A :class:`RowWindow` is a tensor of the window's shape
and dtype that holds no data: any op that needs its values reads them from its :class:`RowSource` (DCP's save clones
each local shard, so a save reads one window at a time), ``narrow`` / slicing give a smaller window, and ``copy_``
into it (DCP's load, TorchRec's test harness, ``load_state_dict``) hands the values to the source. A source is one
part of one table shard (its weights, its row IDs, or one optimizer state).

Example::

    window = RowWindow(source, part=0, row0=0, rows=4096, col0=0, cols=16)
    window.clone()                       # the rows, read now
    window.narrow(0, 8, 2).copy_(rows)   # two rows written through to the source
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Tuple

import torch
from torch.utils._pytree import tree_map

_aten = torch.ops.aten
_KEPT_FORMATS = (torch.preserve_format, torch.contiguous_format)  # a contiguous tensor is its own clone in these


class RowSource(Protocol):
    """Where a window's values live: ``part`` names one tensor of a table shard (see :class:`RowWindow`)."""

    def dtype(self, part: int) -> torch.dtype:
        """The dtype of ``part``'s tensor."""

    def read(self, part: int, row0: int, rows: int) -> torch.Tensor:
        """``part``'s rows ``[row0, row0 + rows)``, all columns (1-D parts: ``[rows]``), in a tensor of its own: no
        other tensor refers to its memory, so a window's ``clone`` may be that tensor."""

    def write(self, part: int, row0: int, col0: int, values: torch.Tensor) -> None:
        """Write ``values`` (``[rows, cols]``, or ``[rows]`` for 1-D parts) at ``part``'s rows from ``row0`` and columns
        from ``col0``."""

    def holds(self, other: "RowSource") -> bool:
        """True if a copy from ``other``'s windows into this source's windows at the same place changes nothing
        (``other``'s values are this source's: the same table shard, loaded or current)."""


class RowWindow(torch.Tensor):
    """Rows ``[row0, row0 + rows)`` and columns ``[col0, col0 + cols)`` of part ``part`` of ``source``; ``cols`` is
    None for a 1-D part. Lives on the host; holds no data (its storage is empty, so DCP's save clones it: a read)."""

    source: RowSource
    part: int
    row0: int
    col0: int

    @staticmethod
    def __new__(cls, source: RowSource, part: int, row0: int, rows: int, col0: int = 0,
                cols: Optional[int] = None) -> "RowWindow":
        shape = (rows,) if cols is None else (rows, cols)
        return torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=source.dtype(part), device=torch.device("cpu"), requires_grad=False, storage_size=0
        )

    def __init__(self, source: RowSource, part: int, row0: int, rows: int, col0: int = 0,
                 cols: Optional[int] = None) -> None:
        self.source, self.part, self.row0, self.col0 = source, part, row0, col0

    def __repr__(self) -> str:  # type: ignore[override]  # no data to show: say what it stands for
        return f"RowWindow(part={self.part}, rows={self.row0}+{self.shape[0]}, shape={tuple(self.shape)})"

    def __deepcopy__(self, memo: Any) -> "RowWindow":  # a view: copying it copies no rows (TorchRec deep-copies
        return self._sub(0, 0, self.shape[0])           # a KEY_VALUE table's state_dict entries on every call)

    def values_now(self) -> torch.Tensor:
        """The window's values, read from the source."""
        rows = self.source.read(self.part, self.row0, self.shape[0])
        return rows if self.dim() == 1 else rows[:, self.col0:self.col0 + self.shape[1]]

    def _place(self) -> Tuple[Any, int, int, int, Tuple[int, ...]]:
        return (self.source, self.part, self.row0, self.col0, tuple(self.shape))

    def _sub(self, dim: int, start: int, end: int) -> "RowWindow":
        rows, cols = self.shape[0], None if self.dim() == 1 else self.shape[1]
        if dim == 0:
            return RowWindow(self.source, self.part, self.row0 + start, end - start, self.col0, cols)
        return RowWindow(self.source, self.part, self.row0, rows, self.col0 + start, end - start)

    def _copy_from(self, src: Any) -> "RowWindow":
        if isinstance(src, RowWindow) and src.part == self.part and src._place()[1:] == self._place()[1:] \
                and self.source.holds(src.source):
            return self  # loading a table's own views back: their values are already the table's
        values = src.values_now() if isinstance(src, RowWindow) else src
        values = values.expand(self.shape).to(device="cpu", dtype=self.dtype)
        self.source.write(self.part, self.row0, self.col0, values)
        return self

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]  # func first
        kwargs = kwargs or {}
        if func in (_aten.detach.default, _aten.alias.default):
            return args[0]._sub(0, 0, args[0].shape[0])  # a view: a new window over the same rows
        if func is _aten.is_pinned.default:
            return False
        if func is _aten.clone.default and kwargs.get("memory_format", torch.preserve_format) in _KEPT_FORMATS:
            # DCP's save clones each window; the rows read are the window's own (RowSource.read): a second copy of
            # them would only cost a window's copy and memory
            values = args[0].values_now()
            whole = values.is_contiguous() and values.untyped_storage().nbytes() == values.nbytes
            return values if whole else values.clone()
        if func is _aten.slice.Tensor:
            window, dim, start, end = (list(args) + [0, None, None])[:4]
            step = args[4] if len(args) > 4 else kwargs.get("step", 1)
            size = window.shape[dim]
            start, end = max(0, min(size, start or 0)), size if end is None else max(0, min(size, end))
            if step == 1:
                return window._sub(dim % window.dim(), start, max(start, end))
        if func is _aten.copy_.default and isinstance(args[0], RowWindow):
            return args[0]._copy_from(args[1])
        if func is _aten.resize_.default and tuple(args[1]) == tuple(args[0].shape):
            return args[0]
        if func._schema.is_mutable and any(isinstance(a, RowWindow) for a in args):
            raise RuntimeError(
                f"{func} on a KEY_VALUE table's state_dict window: its rows live in the table's tiers, and only "
                "copy_ writes through to them (window.copy_(values))"
            )
        return func(*tree_map(_values, args), **tree_map(_values, kwargs))


def _values(value: Any) -> Any:
    return value.values_now() if isinstance(value, RowWindow) else value

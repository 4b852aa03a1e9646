"""A hash table's policy state in stock ``fused_optimizer.state_dict()``, so that DCP alone restores its decisions.

Besides its rows, a hash table shard holds what decides which IDs get a row and which leave the device: which IDs
its pool (a FUSED table's rows, a KEY_VALUE table's device cache) holds at which slot and when each was last used,
the ID map's free slots, the step, the counters, the optimizer's iteration, and its eviction, cadence and admission
policies' state. ``fused_optimizer.state_dict()`` carries it next to the table's optimizer states as
``<table>.policy_state``: ``{"<shard index>": bytes, "version": tensor}``, one entry per shard of the table this rank
holds (the index of the shard in the table's sharding), so DCP writes each rank's own and reads it back where that
shard is.

The bytes are a NumPy ``.npz`` archive (read with ``allow_pickle=False``: never pickle): the shard's layout and JSON
values in a ``header`` array, the tensors as arrays. A loaded entry (DCP loads in place; ``load_state_dict`` hands
it over) is applied with the table's IDs: when the shard has the saved layout (the same plan), the pool holds the
saved IDs at their slots and every policy continues exactly; with another layout, policies start over at the saved
step (as the Saver's reshard does). A plain KEY_VALUE table has no entry: its rows and optimizer state are exact,
its device cache refills on demand.

DCP requires every key it loads into to be in the checkpoint: a DCP load onto more shards of a hash table than were
saved (refused anyway for row_wise: hash placement), or of a hash table saved without this entry, fails in DCP with
``Missing key in checkpoint state_dict: ...<table>.policy_state.<n>``; move such a table with the Saver.

Memory: a shard's entry holds 24 B per pooled ID plus its policies' state, twice while DCP serializes it.

Example::

    state = {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}
    dcp.load(state, checkpoint_id="/ckpt/1")   # rows, optimizer state and policy state of every hash table
"""

from __future__ import annotations

import dataclasses
import io
import json
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from torchrec_ascend.checkpoint.layout import ShardLayout
from torchrec_ascend.checkpoint.restore import trial_slot_restore
from torchrec_ascend.errors import ConfigError, StorageError
from torchrec_ascend.kernels.fused import HashRows

#: The key suffix of a hash table's entry in its fused optimizer's state: ``<table>.policy_state``.
POLICY_STATE = "policy_state"
_FORMAT = 1
_VERSION = "version"
_POOLED = ("ids", "slots", "last_used")


@dataclasses.dataclass
class SavedShard:
    """A shard's policy state as saved: its layout, pooled IDs (slots, last use) and :meth:`HashRows.shard_state`."""

    layout: ShardLayout
    ids: torch.Tensor
    slots: torch.Tensor
    last_used: torch.Tensor
    state: Dict[str, Any]


def shard_key(kernel: HashRows, t: int) -> str:
    """The shard's index in its table's sharding, as the entry keys it."""
    table = kernel.shard_info(t).table
    return str(table.global_metadata.shards_metadata.index(table.local_metadata))


def encode(kernel: HashRows, t: int) -> bytes:
    """Shard ``t``'s policy state as bytes (see the module docstring).

    Raises:
        ConfigError: a policy keeps a tensor NumPy cannot hold (e.g. bfloat16).
    """
    info = kernel.shard_info(t)
    ids, slots, last_used = kernel.slot_table(t).held()
    arrays: Dict[str, torch.Tensor] = {"pooled/ids": ids, "pooled/slots": slots, "pooled/last_used": last_used}
    values: Dict[str, Any] = {}
    for key, value in kernel.shard_state(t).items():
        if isinstance(value, torch.Tensor):
            arrays[key] = value
        elif isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
            arrays.update({f"{key}/{name}": v for name, v in value.items()})
        else:
            values[key] = value
    header = json.dumps({"format": _FORMAT, "layout": ShardLayout.of(info).to_json(), "values": values})
    buffer = io.BytesIO()
    try:
        numpy_arrays = {k: v.detach().cpu().numpy() for k, v in arrays.items()}
    except TypeError as error:
        raise ConfigError(f"hash table {info.name!r}: a policy keeps state NumPy cannot hold ({error}); keep policy "
                          "state in int, float or bool tensors") from None
    numpy_arrays["header"] = np.frombuffer(header.encode(), dtype=np.uint8)
    np.savez(buffer, **numpy_arrays)  # type: ignore[arg-type]  # numpy's stub types the keywords as allow_pickle
    return buffer.getvalue()


def decode(data: Any, table: str) -> SavedShard:
    """The :class:`SavedShard` in ``data`` (bytes from :func:`encode`).

    Raises:
        StorageError: ``data`` is not such bytes (damaged or crafted), naming the table.
    """
    where = f"hash table {table!r}: its {POLICY_STATE} entry"
    if not isinstance(data, (bytes, bytearray)):
        raise StorageError(f"{where} is a {type(data).__name__}, not bytes; load a checkpoint saved from "
                           "fused_optimizer.state_dict()")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {key: torch.from_numpy(archive[key].copy()) for key in archive.files}
        header = json.loads(bytes(arrays.pop("header").numpy()).decode())
        if header.get("format") != _FORMAT or not isinstance(header.get("values"), dict):
            raise ValueError(f"format {header.get('format')!r}, expected {_FORMAT}")
        layout = ShardLayout.from_json(header["layout"])
        pooled = [arrays.pop(f"pooled/{name}") for name in _POOLED]
    except Exception as error:  # whatever a damaged archive makes numpy, json or the layout raise
        raise StorageError(f"{where} cannot be read: {type(error).__name__}: {error}; it is damaged or "
                           "crafted") from None
    if any(p.dtype != torch.int64 or p.dim() != 1 or p.numel() != pooled[0].numel() for p in pooled):
        raise StorageError(f"{where} is damaged or crafted: its pooled IDs, slots and last uses are not int64 "
                           "vectors of one length")
    state: Dict[str, Any] = dict(header["values"])
    for key, value in arrays.items():
        group, _, name = key.partition("/")
        if name:
            if not isinstance(state.setdefault(group, {}), dict):
                raise StorageError(f"{where} is damaged or crafted: {group!r} is both a value and arrays")
            state[group][name] = value
        else:
            state[key] = value
    return SavedShard(layout, pooled[0], pooled[1], pooled[2], state)


class PolicyState:
    """A table's ``<table>.policy_state`` entry in its fused optimizer's ``state`` (PyTorch's stateful protocol:
    TorchRec's optimizers call ``state_dict()`` when they save it and ``load_state_dict()`` when they load it).

    Args:
        shards: this rank's (kernel, table index) shards of the table.

    Example::

        entry = PolicyState([(kernel, 0)])
        saved = entry.state_dict()     # {"0": b"..."}
    """

    def __init__(self, shards: List[Tuple[HashRows, int]]) -> None:
        self.shards = shards

    def state_dict(self) -> Dict[str, Any]:
        slot = _Slot({shard_key(kernel, t): encode(kernel, t) for kernel, t in self.shards})
        slot.given = dict(slot)
        # A tensor member: DCP's keys for checkpoints before torch 2.4 (which it falls back to when a rank lacks
        # keys of the checkpoint, as every rank lacks the other ranks' shards here) then name each shard too.
        slot[_VERSION] = torch.tensor(_FORMAT)
        self._register(weakref.ref(slot))  # the caller's state_dict holds it (and DCP loads into it) or drops it
        return slot

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for kernel, t in self.shards:  # refuse a damaged entry now, not at the table's next load
            decode(state.get(shard_key(kernel, t)), kernel.shard_info(t).name)
        slot = _Slot(state)
        slot.given = {}
        self._register(lambda: slot)  # held until applied with the table's IDs
        for kernel, t in self.shards:
            if not kernel.shard_info(t).lower_tiers:
                apply_to_fused(kernel, t)  # the model's IDs may be in already (its load_state_dict came first)

    def _register(self, slot: Callable[[], Optional["_Slot"]]) -> None:
        for kernel, t in self.shards:
            _latest.setdefault(kernel, {})[t] = slot


class _Slot(dict):
    """The ``{shard index: bytes}`` one ``state_dict()`` handed out: DCP loads into it in place, so a value that is
    not the one given was loaded."""

    given: Dict[str, Any]


#: per kernel and table, the latest entry handed out or loaded (a weak reference to one handed out)
_latest: "weakref.WeakKeyDictionary[HashRows, Dict[int, Callable[[], Optional[_Slot]]]]" = weakref.WeakKeyDictionary()


def _loaded_value(kernel: HashRows, t: int) -> Tuple[Optional[_Slot], Any]:
    ref = _latest.get(kernel, {}).get(t)
    slot = ref() if ref is not None else None
    if slot is None:
        return None, None
    key = shard_key(kernel, t)
    value = slot.get(key)
    return slot, (value if value is not None and value is not slot.given.get(key) else None)


def awaited(kernel: HashRows, t: int) -> bool:
    """Whether the latest ``fused_optimizer.state_dict()`` entry of shard ``t`` is still waiting for a load."""
    slot, value = _loaded_value(kernel, t)
    return slot is not None and value is None


def take_loaded(kernel: HashRows, t: int) -> Optional[SavedShard]:
    """The policy state loaded for shard ``t`` since its last ``fused_optimizer.state_dict()``, if any (taken: a
    second call gives None).

    Raises:
        StorageError: the loaded entry is damaged or crafted.
    """
    _, value = _loaded_value(kernel, t)
    if value is None:
        return None
    del _latest[kernel][t]
    return decode(value, kernel.shard_info(t).name)


def restore_pool(kernel: HashRows, t: int, ids: torch.Tensor, slots: torch.Tensor,
                 saved: Optional[SavedShard]) -> bool:
    """Make shard ``t``'s slot table hold ``ids`` at ``slots``: exactly as saved (last uses, free slots, step,
    counters, policies, optimizer iteration) when ``saved`` has the shard's layout and these IDs at these slots,
    else with fresh policies (at the saved step, if any). Returns whether the restore was exact.

    Raises:
        ConfigError: ``saved`` has the shard's layout but other IDs or slots (the model's and the optimizer's state
            come from different saves), or a policy state that does not fit; the shard is unchanged.
    """
    table = kernel.slot_table(t)
    if saved is None or saved.layout != ShardLayout.of(kernel.shard_info(t)):
        step = {"step": int(saved.state.get("step", 0))} if saved is not None else {}
        table.restore(ids, slots, torch.zeros_like(ids), step)
        return False
    order, saved_order = torch.argsort(slots), torch.argsort(saved.slots)
    if not (torch.equal(slots[order], saved.slots[saved_order]) and torch.equal(ids[order], saved.ids[saved_order])):
        raise ConfigError(
            f"hash table {table.table!r}: the loaded {POLICY_STATE} places other IDs than the loaded rows (the model's "
            "and the optimizer's state_dict come from different saves); nothing was changed. Load both from one "
            "checkpoint"
        )
    trial_slot_restore(kernel, t, saved.ids, saved.slots, saved.last_used, saved.state,
                       f"hash table {table.table!r}: the loaded {POLICY_STATE}'s IDs and state")
    table.restore(saved.ids, saved.slots, saved.last_used, saved.state)
    if "iteration" in saved.state:
        kernel.set_optimizer_iteration(int(saved.state["iteration"]))
    return True


def apply_to_fused(kernel: HashRows, t: int) -> None:
    """Apply a loaded policy state to FUSED shard ``t`` if its pool holds the saved IDs at their slots already."""
    _, value = _loaded_value(kernel, t)
    if value is None:
        return
    saved = decode(value, kernel.shard_info(t).name)
    ids, slots, _ = kernel.slot_table(t).held()
    if saved.layout == ShardLayout.of(kernel.shard_info(t)) and torch.equal(
            torch.sort(ids).values, torch.sort(saved.ids).values):
        del _latest[kernel][t]
        restore_pool(kernel, t, ids, slots, saved)

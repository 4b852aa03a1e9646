"""The job's checkpoints: every ``--save-every`` steps, on SIGTERM and at the end; a restarted job resumes from the
last complete one and trains on exactly as an uninterrupted job would (same batches, RNG, rows and optimizer state).

Layout of ``<out>/checkpoint/``::

    sparse/                 the item table from every tier (IDs, rows, optimizer, policy state, counters): Saver
                            versions, a full one, then incremental ones
    dense/step-00000120/    torch.distributed.checkpoint: the encoder, its AdamW state, and each rank's progress
                            (step, losses, hit rates, its RNG state)
    latest.json             written last, atomically, by rank 0: the step, the Saver version and the DCP folder
                            of the last complete checkpoint, the run's settings, and ``done`` once the job finished

A save killed at any point (SIGKILL, a lost rank) leaves ``latest.json`` naming the previous complete checkpoint; a
Saver version or DCP folder it does not name is never read. A job started with an ``--out`` whose ``latest.json``
is not ``done`` resumes from it; a finished one (or none) starts over.

Example::

    marker = latest(out)                                  # None: start over
    progress = restore(dmp, dense_optimizer, out, marker) if marker else Progress()
    ...
    save(dmp, dense_optimizer, out, progress, settings)  # collective
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from torchrec_ascend import Saver
from torchrec_ascend.checkpoint import dense_state_dict
from torchrec_ascend.checkpoint.saver import local_shards
from torchrec_ascend.errors import ConfigError

MARKER = "latest.json"
# Settings a resumed job may change: where things are, how long it trains, how often it saves.
FREE_SETTINGS = ("out", "data_dir", "epochs", "save_every")


@dataclasses.dataclass
class Progress:
    """One rank's place in the run: what a resumed job needs besides the model to go on as if never stopped.

    Attributes:
        step: steps trained (global: the same on every rank).
        losses: this rank's loss per step.
        hit_rates: the item cache's hit rate per finished epoch (all ranks).
        epoch_counters: the cache counters at the start of the current epoch (for its hit rate).
        resumed_at: the steps this run was resumed at.
    """

    step: int = 0
    losses: List[float] = dataclasses.field(default_factory=list)
    hit_rates: List[Optional[float]] = dataclasses.field(default_factory=list)
    epoch_counters: Dict[str, float] = dataclasses.field(default_factory=dict)
    resumed_at: List[int] = dataclasses.field(default_factory=list)


def checkpoint_dir(out: Path) -> Path:
    return out / "checkpoint"


def latest(out: Path, settings: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The last complete checkpoint of an unfinished run in ``out`` (``None``: none, or the run finished).

    Raises:
        ConfigError: the run was started with other settings (its batches would differ).
    """
    path = checkpoint_dir(out) / MARKER
    if not path.is_file():
        return None
    marker = json.loads(path.read_text())
    if marker["done"]:
        return None
    changed = {k: (v, settings.get(k)) for k, v in marker["settings"].items()
               if k not in FREE_SETTINGS and settings.get(k) != v}
    if changed:
        listed = ", ".join(f"{k}: {then!r} then, {now!r} now" for k, (then, now) in changed.items())
        raise ConfigError(
            f"{path}: the interrupted run there was started with other settings ({listed}); resume it with the same "
            "ones, or start over with another --out (or remove that folder)"
        )
    return marker


def _state(dmp: nn.Module, dense_optimizer: Any, progress: Progress) -> Dict[str, Any]:
    rank = dist.get_rank()
    return {
        "model": dense_state_dict(dmp),
        "optim": dense_optimizer.state_dict(),
        f"rank{rank}": {"rng": torch.get_rng_state(), "progress": json.dumps(dataclasses.asdict(progress))},
    }


def save(dmp: nn.Module, dense_optimizer: Any, out: Path, progress: Progress, settings: Dict[str, Any],
         done: bool = False) -> Dict[str, Any]:
    """Save the model and every rank's progress as the new latest checkpoint (collective; no batch in flight).

    Returns:
        Dict[str, Any]: the new ``latest.json``.
    """
    root = checkpoint_dir(out)
    previous = (root / MARKER).is_file()
    info = Saver().save(dmp, str(root / "sparse"), incremental=previous)
    dense = f"dense/step-{progress.step:08d}"
    if dist.get_rank() == 0:  # an earlier try at this step that no marker names (killed before its marker)
        shutil.rmtree(root / dense, ignore_errors=True)
    dist.barrier()
    dcp.save(_state(dmp, dense_optimizer, progress), checkpoint_id=root / dense)
    marker = {"step": progress.step, "sparse_version": info.version, "dense": dense, "settings": settings,
              "done": done}
    dist.barrier()  # every rank's part is written
    if dist.get_rank() == 0:
        write_atomically(root / MARKER, json.dumps(marker, indent=1, default=str))
        for old in (root / "dense").iterdir():  # the DCP folders the marker no longer names
            if old.name != Path(dense).name:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return marker


def mark_done(out: Path) -> None:
    """Record that the run finished (rank 0): the next job with this ``--out`` starts over."""
    path = checkpoint_dir(out) / MARKER
    write_atomically(path, json.dumps({**json.loads(path.read_text()), "done": True}, indent=1))


def restore(dmp: nn.Module, dense_optimizer: Any, out: Path, marker: Dict[str, Any]) -> Progress:
    """Load the checkpoint ``marker`` names into the model and optimizer, set this rank's RNG; return its progress."""
    root = checkpoint_dir(out)
    Saver().load(dmp, str(root / "sparse"), version=marker["sparse_version"])
    dense_optimizer.init_state()  # AdamW's state is created lazily: DCP loads into existing tensors
    rank = dist.get_rank()
    state = _state(dmp, dense_optimizer, Progress())
    # DCP loads in place: the state_dict tensors share the parameters' storage. (``dmp.load_state_dict`` would also
    # read the KEY_VALUE table's state_dict windows, which refuse a hash shard holding more IDs than its rows.)
    dcp.load(state, checkpoint_id=root / marker["dense"])
    dense_optimizer.load_state_dict(state["optim"])
    torch.set_rng_state(state[f"rank{rank}"]["rng"])
    progress = Progress(**json.loads(state[f"rank{rank}"]["progress"]))
    if progress.step != marker["step"]:
        raise ConfigError(f"{root / marker['dense']}: rank {rank} saved step {progress.step}, {MARKER} says "
                          f"{marker['step']}")
    progress.resumed_at.append(progress.step)
    return progress


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never a part."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def model_digest(dmp: nn.Module, dense_optimizer: Any) -> str:
    """SHA-256 of the trained model: dense parameters and AdamW state, and every item ID's row and optimizer state
    from every tier (sorted by ID: where a row sits does not count). Collective. Equal digests: the same model.

    Example::

        model_digest(dmp, dense_optimizer)   # 'c0ffee...'
    """
    digest = hashlib.sha256()

    def add(name: str, tensor: torch.Tensor) -> None:
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())

    for name, value in sorted(dense_state_dict(dmp).items()):
        add(name, value)
    for key, state in sorted(dense_optimizer.state_dict()["state"].items()):
        for name, value in sorted(state.items()):
            add(f"{key}.{name}", torch.as_tensor(value))
    for kernel, t, layout in local_shards(dmp):  # every hash / KEY_VALUE table shard on this rank, all tiers
        blocks = list(kernel.export_shard(t)[0])
        ids = torch.cat([block.ids for block in blocks])
        order = torch.argsort(ids)
        add(f"{layout.table}.ids", ids[order])
        add(f"{layout.table}.rows", torch.cat([block.rows for block in blocks])[order])  # weights, optimizer state
    parts: List[Optional[str]] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, digest.hexdigest())
    return hashlib.sha256("".join(str(p) for p in parts).encode()).hexdigest()

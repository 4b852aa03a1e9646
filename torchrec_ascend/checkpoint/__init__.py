"""Checkpoints of hash and KEY_VALUE tables: full and incremental, atomic, reshardable.

What is covered by which path:

* **Stock ``state_dict()`` and torch.distributed.checkpoint (DCP)**, TorchRec's idiom, for every table: a FUSED
  hash table's rows come with ``<table>.weight_id`` (the ID of each row, :mod:`~torchrec_ascend.checkpoint.stock`);
  a KEY_VALUE table's entries are windows over its rows in every tier
  (:mod:`~torchrec_ascend.checkpoint.key_value_state`); ``fused_optimizer.state_dict()`` holds KEY_VALUE optimizer
  states sized by the table and each hash table's policy state
  (:mod:`~torchrec_ascend.checkpoint.policy_state`). With the same plan a load is exact; another plan is taken
  where rows can follow their offsets and refused naming the table where hash placement forbids it.
* **The** :class:`Saver`, for hash and KEY_VALUE tables: every ID with its weights and optimizer state from every
  tier, the policies' state and the counters, written incrementally (``save(model, path, incremental=True)`` writes
  only rows changed since the previous save); loads exactly at the same layout and reshards otherwise (any world
  size, sharding type or column split; see :mod:`~torchrec_ascend.checkpoint.restore`). The rest of the model then
  goes through DCP: :func:`dense_state_dict` gives ``state_dict()`` without the Saver's tables.

The Saver's files: one data file per rank plus a JSON metadata file per save; raw arrays with CRC-32 checksums,
never pickle; every file written atomically; a save exists once its metadata file is renamed into place, so a save
killed at any point leaves the previous ones loadable (:mod:`~torchrec_ascend.checkpoint.versions`). Damaged files
raise :class:`~torchrec_ascend.errors.StorageError` naming the file. Checkpoints are untrusted input: the metadata
is checked field by field (:mod:`~torchrec_ascend.checkpoint.schema`), file names never leave their folder, nothing
is allocated beyond a file's size, and a load reads and checks everything on every rank before it changes any table.

Example::

    from torchrec_ascend.checkpoint import Saver, dense_state_dict
    import torch.distributed.checkpoint as dcp

    Saver().save(dmp, "/ckpt/sparse", incremental=True)
    dcp.save({"model": dense_state_dict(dmp), "optim": dense_optimizer.state_dict()}, checkpoint_id="/ckpt/dense")

    Saver().load(dmp, "/ckpt/sparse")            # any world size
    state = {"model": dense_state_dict(dmp), "optim": dense_optimizer.state_dict()}
    dcp.load(state, checkpoint_id="/ckpt/dense")
    dmp.load_state_dict(state["model"], strict=False)
    dense_optimizer.load_state_dict(state["optim"])
"""

from torchrec_ascend.checkpoint.saver import Saver
from torchrec_ascend.checkpoint.stock import dense_state_dict
from torchrec_ascend.checkpoint.versions import CheckpointInfo

__all__ = ["CheckpointInfo", "Saver", "dense_state_dict"]

"""Checkpoints of hash and KEY_VALUE tables: full and incremental, atomic, reshardable.

What is covered by which path:

* **Hash tables (FUSED or KEY_VALUE) and plain KEY_VALUE tables**: :class:`Saver`. Their rows are not what stock
  ``state_dict()`` shows (a FUSED hash table's pool rows mean nothing without its ID map; a KEY_VALUE table's rows
  live in three tiers and ``state_dict()`` holds a zero-cost placeholder). The Saver writes every ID with its
  weights and optimizer state from every tier, the policies' state and the counters; loads exactly at the same
  layout and reshards otherwise (any world size, sharding type or column split; see
  :mod:`~torchrec_ascend.checkpoint.restore`). ``save(model, path, incremental=True)`` writes only rows changed
  since the previous save.
* **FUSED hash tables, the stock way**: ``state_dict()`` carries each row's ID (``<table>.weight_id``, see
  :mod:`~torchrec_ascend.checkpoint.stock`), so ``load_state_dict()`` and DCP round-trip them with the same plan;
  loads that would need hash resharding are refused (use the Saver). Policy state is not included.
* **Everything else** (dense parameters, plain FUSED tables, the dense optimizer): stock
  ``torch.distributed.checkpoint`` (DCP), which reshards plain tables itself. :func:`dense_state_dict` gives the
  model's ``state_dict()`` without the Saver's tables, so DCP neither writes KEY_VALUE placeholders nor restores
  meaningless pool rows over them.

Files: one data file per rank plus a JSON metadata file per save; raw arrays with CRC-32 checksums, never pickle;
every file written atomically; a save exists once its metadata file is renamed into place, so a save killed at any
point leaves the previous ones loadable (:mod:`~torchrec_ascend.checkpoint.versions`). Damaged files raise
:class:`~torchrec_ascend.errors.StorageError` naming the file. Checkpoints are untrusted input: the metadata is
checked field by field (:mod:`~torchrec_ascend.checkpoint.schema`), file names never leave their folder, nothing is
allocated beyond a file's size, and a load reads and checks everything on every rank before it changes any table.

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

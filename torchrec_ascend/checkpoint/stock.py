"""The stock-checkpoint side: a model's ``state_dict()`` without the tables the :class:`Saver` covers.

Dense parameters and plain FUSED tables are checkpointed the TorchRec way, with ``torch.distributed.checkpoint``
(DCP), which also reshards plain tables. Hash tables and KEY_VALUE tables appear in ``state_dict()`` too, but as
what DCP cannot use: a FUSED hash table's pool rows (meaningless without its ID map) and a KEY_VALUE table's
zero-cost placeholder (which DCP would write out as zeros of the table's full size). :func:`dense_state_dict`
leaves them out; load it back with ``load_state_dict(..., strict=False)``.

Example::

    import torch.distributed.checkpoint as dcp

    dcp.save({"model": dense_state_dict(dmp)}, checkpoint_id="/ckpt/dense")
    state = {"model": dense_state_dict(dmp)}
    dcp.load(state, checkpoint_id="/ckpt/dense")
    dmp.load_state_dict(state["model"], strict=False)
"""

from __future__ import annotations

import re
from typing import Any, Dict, Set

import torch

from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.walk import sharded_kernels


def saver_keys(model: torch.nn.Module) -> Set[str]:
    """The keys of ``model.state_dict()`` that hold tables the Saver covers (hash tables, KEY_VALUE tables).

    Example::

        assert "ebc.embedding_bags.user.weight" in saver_keys(dmp)
    """
    names = {
        kernel.shard_info(t).name
        for kernel in sharded_kernels(model)
        if isinstance(kernel, HashRows)
        for t in range(kernel.num_tables)
    }
    if not names:
        return set()
    pattern = re.compile(r"(^|\.)(embedding_bags|embeddings)\.(" + "|".join(map(re.escape, names)) + r")\.weight$")
    return {key for key in model.state_dict() if pattern.search(key)}


def dense_state_dict(model: torch.nn.Module) -> Dict[str, Any]:
    """``model.state_dict()`` without the Saver's tables: dense parameters, buffers and plain FUSED tables.

    Returns:
        Dict[str, Any]: for DCP (``dcp.save`` / ``dcp.load``), then ``model.load_state_dict(..., strict=False)``.

    Example::

        dcp.save({"model": dense_state_dict(dmp)}, checkpoint_id="/ckpt/dense")
    """
    skip = saver_keys(model)
    return {key: value for key, value in model.state_dict().items() if key not in skip}

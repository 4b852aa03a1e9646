"""How deep the pipeline is and how many host threads it uses: validation, defaults, and telling the kernels.

* Depth (``pipe_n_batch``): how many batches are in flight at once, counting the one being computed. 1 runs every
  stage of a batch before the next batch starts (no overlap); 12 is RecSDK's limit.
* Host threads: the pool that runs a stage over a batch's sharded modules in parallel. By default the cores this
  process may run on (``os.sched_getaffinity``), shared among the local ranks (``LOCAL_WORLD_SIZE``), minus torch's
  intra-op threads (they belong to compute), at least 1 and at most 6 (RecSDK's pool size). The
  ``TORCHREC_ASCEND_PIPELINE_HOST_THREADS`` environment variable overrides the default; an argument overrides both.
* Kernels that keep batches' rows pinned in a cache (KEY_VALUE) must protect at least ``depth`` batches: every
  object in the model with ``set_pipeline_depth(depth)`` is told the depth when the pipeline is built, and a kernel
  that cannot pin that many batches refuses by raising.

Example::

    validate_depth(3)                       # 3
    host_threads(None)                      # e.g. 1 on a 2-core machine running 2 ranks
    apply_pipeline_depth(model, 3)          # ['sparse.ebc._lookups.0._emb_modules.0', ...]
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

import torch

from torchrec_ascend.errors import ConfigError

MAX_DEPTH = 12
MAX_DEFAULT_HOST_THREADS = 6
HOST_THREADS_ENV = "TORCHREC_ASCEND_PIPELINE_HOST_THREADS"


def validate_depth(depth: Any) -> int:
    """``depth`` as an int, if it is an integer from 1 to 12.

    Raises:
        ConfigError: anything else.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise ConfigError(
            f"HybridTrainPipelineSparseDist: pipe_n_batch={depth!r} is invalid; it must be an integer from 1 (no "
            f"overlap: each batch finishes before the next starts) to {MAX_DEPTH} (batches in flight at once, "
            f"counting the one being computed). 3 is the default."
        )
    return depth


def host_threads(requested: Optional[int]) -> int:
    """Threads for the host-stage pool: ``requested``, else the environment variable, else sized from the cores.

    Raises:
        ConfigError: ``requested`` or the environment variable is not a positive integer.
    """
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ConfigError(
                f"HybridTrainPipelineSparseDist: host_threads={requested!r} is invalid; pass a positive integer, or "
                f"None to size the pool from the cores available to this process."
            )
        return requested
    from_env = os.environ.get(HOST_THREADS_ENV, "").strip()
    if from_env:
        if not from_env.isdigit() or int(from_env) < 1:
            raise ConfigError(
                f"{HOST_THREADS_ENV}={from_env!r} is invalid; set it to a positive integer, or unset it to size the "
                f"pipeline's host thread pool from the cores available to this process."
            )
        return int(from_env)
    return default_host_threads(len(os.sched_getaffinity(0)), _local_ranks(), torch.get_num_threads())


def default_host_threads(cores: int, local_ranks: int, intra_op_threads: int) -> int:
    """The default pool size: this rank's share of ``cores`` minus ``intra_op_threads``, clamped to [1, 6]."""
    share = cores // max(local_ranks, 1)
    return max(1, min(MAX_DEFAULT_HOST_THREADS, share - intra_op_threads))


def _local_ranks() -> int:
    value = os.environ.get("LOCAL_WORLD_SIZE", "1")  # set by torchrun
    return int(value) if value.isdigit() and int(value) > 0 else 1


def apply_pipeline_depth(model: torch.nn.Module, depth: int) -> List[str]:
    """Call ``set_pipeline_depth(depth)`` on every object of ``model`` that has it; returns their paths.

    Looks at every submodule, at the kernels sharded modules hide from ``named_modules()``
    (:func:`~torchrec_ascend.kernels.walk.sharded_kernels`), and at each one's ``emb_module`` attribute, for kernels
    that keep their table object outside the module tree.

    Raises:
        ConfigError: a kernel refused ``depth``; the message names the kernel and carries its reason.
    """
    from torchrec_ascend.kernels.walk import sharded_kernels

    hidden = [(f"<kernel {i}: {type(k).__name__}>", k) for i, k in enumerate(sharded_kernels(model))]
    seen, configured = set(), []
    for name, module in list(model.named_modules()) + hidden:
        table_path = f"{name}.emb_module" if name else "emb_module"
        for path, obj in ((name, module), (table_path, getattr(module, "emb_module", None))):
            setter = getattr(obj, "set_pipeline_depth", None)
            if obj is None or id(obj) in seen or not callable(setter):
                continue
            seen.add(id(obj))
            try:
                setter(depth)
            except Exception as err:
                raise ConfigError(
                    f"HybridTrainPipelineSparseDist: pipe_n_batch={depth} was refused by {type(obj).__name__} at "
                    f"'{path or '<model>'}': {err}. Lower pipe_n_batch, or give that table's cache room for {depth} "
                    f"batches of rows."
                ) from err
            configured.append(path)
    return configured

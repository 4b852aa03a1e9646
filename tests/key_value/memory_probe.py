"""What the KEY_VALUE memory tests run in a fresh process (a 1-rank gloo group, so the peak RSS is theirs alone): a
one-table model whose rows lie below a small cache, rows given by a formula of their key (the tests' oracle), and
the peak RSS an action adds.

Example::

    out = run_fresh('''
        from torchrec_ascend import Saver
        dmp, store = key_value_model(os.path.join(root, "saved"), num_embeddings=1024, dim=128, load_factor=0.25)
        fill(store, 1_000_000)
        print(json.dumps({"grown": peak_rise(lambda: Saver().load(dmp, checkpoint))}))
    ''', tmp_path)
"""

import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.kernels.walk import sharded_kernels
from torchrec_ascend.native.memory import trim_heap

BLOCK = 65536  # rows filled at a time
_PRELUDE = f"""\
import json, os, sys, tempfile
import torch
import torch.distributed as dist
sys.path.insert(0, {str(Path(__file__).parent)!r})
from memory_probe import fill, key_value_model, keys_at, peak_rise, rows_of
root = tempfile.mkdtemp(dir=sys.argv[1])
dist.init_process_group("gloo", store=dist.FileStore(os.path.join(root, "pg"), 1), rank=0, world_size=1)
"""


def run_fresh(script: str, tmp_path: Path) -> Dict[str, Any]:
    """Run ``script`` in a fresh process, one thread, in a 1-rank gloo group, after a prelude that imports ``json``,
    ``os``, ``torch``, ``dist`` and this module's helpers and makes ``root`` (a new folder under ``tmp_path``).

    Returns:
        Dict[str, Any]: the last line the script printed, parsed as JSON.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    code = _PRELUDE + textwrap.dedent(script) + "dist.destroy_process_group()\n"
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def key_value_model(directory: str, num_embeddings: int, dim: int, load_factor: float) -> Tuple[Any, Any]:
    """A sharded EBC of one KEY_VALUE hash table ``item`` (feature ``iid``, row-wise Adagrad fused), its disk tier in
    ``directory`` below a host budget of 1 byte; returns the model and the table's host store."""
    ebc = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name="item", embedding_dim=dim, num_embeddings=num_embeddings, feature_names=["iid"])])
    apply_optimizer_in_backward(RowWiseAdagrad, [ebc.embedding_bags["item"].weight], {"lr": 0.1})
    constraints = {"item": ParameterConstraints(
        sharding_types=["table_wise"], compute_kernels=["key_value"], cache_params=CacheParams(load_factor=load_factor),
        key_value_params=KeyValueParams(l2_cache_size=1 / 1024**2, ssd_storage_directory=directory))}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), constraints=constraints)
    sharders = get_default_hybrid_sharders()
    dmp = DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   device=torch.device("cpu"), plan=planner.plan(ebc, sharders), sharders=sharders)
    (kernel,) = list(sharded_kernels(dmp))
    return dmp, kernel.row_tier.stores[0]


def keys_at(start: int, end: int) -> torch.Tensor:
    """The keys numbered ``start .. end - 1`` (spread over the int64 range)."""
    return torch.arange(start, end, dtype=torch.int64) * 2654435761 % (1 << 62)


def rows_of(keys: torch.Tensor, width: int) -> torch.Tensor:
    """A distinct row per key: what :func:`fill` stored for it."""
    return (keys.to(torch.float32)[:, None] % 9973) + torch.arange(width, dtype=torch.float32) / 1000


def fill(store: Any, rows: int) -> None:
    """Load the empty ``store`` with the first ``rows`` keys and their :func:`rows_of`, a block at a time."""
    blocks = (keys_at(s, min(rows, s + BLOCK)) for s in range(0, rows, BLOCK))
    store.load((keys, rows_of(keys, store.width)) for keys in blocks)


def status(field: str) -> int:
    """A byte count of ``/proc/self/status`` (``VmRSS``, ``VmHWM``)."""
    line = next(line for line in open("/proc/self/status") if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def peak_rise(action: Callable[[], None]) -> int:
    """Bytes the process's peak RSS rises above its RSS while ``action`` runs (freed memory is returned to the
    system first, and the peak reset)."""
    gc.collect()
    trim_heap()  # what was freed goes back to the system: RSS is what the process holds
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = status("VmRSS")
    action()
    return status("VmHWM") - before

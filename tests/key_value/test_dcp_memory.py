"""torch.distributed.checkpoint streams a KEY_VALUE table: in a fresh process (1-rank gloo group), a hash table of 1M
rows x 128 fp32 + row-wise Adagrad (516 MB of records, on disk below a tiny cache) is saved with ``dcp.save`` of the
stock ``state_dict()`` and ``fused_optimizer.state_dict()``, and loaded into a new model with ``dcp.load``. Each
one's peak RSS rise (``VmHWM``, reset before it) stays within the stated bound: 8 B per row of the shard (the IDs),
six windows (``WINDOW_BYTES``: the window read, its records and DCP's copy), two tier chunks (raw and decoded, while
the IDs are enumerated), the new disk index and a constant: under half the records.
Every sampled row reads back as saved (oracle: the function that generated the rows)."""

import json
import os
import subprocess
import sys
import textwrap

from torchrec_ascend.checkpoint.sharded import WINDOW_BYTES

ROWS, DIM = 1_000_000, 128
CHUNK = 65536 * (DIM + 1) * 4  # one chunk of the tiers' rows (65,536 rows), read while the IDs are enumerated
CONSTANT = 32 << 20  # the interpreter's, allocator's and DCP's slack

SCRIPT = textwrap.dedent(
    f"""
    import gc, json, os, sys, tempfile
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torchrec
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
    from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
    from torchrec_ascend.native.memory import trim_heap
    from torchrec_ascend.kernels.walk import sharded_kernels

    ROWS, DIM = {ROWS}, {DIM}

    def model(directory):
        ebc = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
            name="item", embedding_dim=DIM, num_embeddings=ROWS, feature_names=["iid"])])
        apply_optimizer_in_backward(RowWiseAdagrad, [ebc.embedding_bags["item"].weight], {{"lr": 0.1}})
        constraints = {{"item": ParameterConstraints(
            sharding_types=["table_wise"], compute_kernels=["key_value"], cache_params=CacheParams(load_factor=0.001),
            key_value_params=KeyValueParams(l2_cache_size=1 / 1024**2, ssd_storage_directory=directory))}}
        planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                           constraints=constraints)
        sharders = get_default_hybrid_sharders()
        dmp = DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                       device=torch.device("cpu"), plan=planner.plan(ebc, sharders), sharders=sharders)
        (kernel,) = list(sharded_kernels(dmp))
        return dmp, kernel.row_tier.stores[0]

    def rows_of(keys, width):  # a distinct row per key
        return (keys.to(torch.float32)[:, None] % 9973) + torch.arange(width, dtype=torch.float32) / 1000

    def keys_at(start, end):
        return torch.arange(start, end, dtype=torch.int64) * 2654435761 % (1 << 62)

    def status(field):
        line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    def peak_rise(action):
        gc.collect()
        trim_heap()  # what was freed goes back to the system: RSS is what the process holds
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        before = status("VmRSS")
        action()
        return status("VmHWM") - before

    root = tempfile.mkdtemp(dir=sys.argv[1])
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(root, "pg"), 1), rank=0, world_size=1)
    saved, store = model(os.path.join(root, "saved"))
    width = store.width
    store.load((keys_at(s, min(ROWS, s + 65536)), rows_of(keys_at(s, min(ROWS, s + 65536)), width))
               for s in range(0, ROWS, 65536))
    checkpoint = os.path.join(root, "ckpt")
    save = peak_rise(lambda: dcp.save({{"model": saved.state_dict(), "optim": saved.fused_optimizer.state_dict()}},
                                      checkpoint_id=checkpoint))
    store.close()
    del saved, store
    loaded, store = model(os.path.join(root, "loaded"))

    def load():
        dcp.load({{"model": loaded.state_dict(), "optim": loaded.fused_optimizer.state_dict()}},
                 checkpoint_id=checkpoint)

    grown = peak_rise(load)
    sample = keys_at(0, ROWS)[torch.randperm(ROWS)[:4096]]
    got, found = store.get(sample)
    print(json.dumps({{"save": save, "load": grown, "records": ROWS * width * 4, "rows": len(store),
                      "index": store.stats()["disk_index_bytes"], "found": bool(found.all()),
                      "equal": bool(torch.equal(got, rows_of(sample, width)))}}))
    store.close()
    dist.destroy_process_group()
    """
)


def test_dcp_saves_and_loads_a_key_value_table_larger_than_its_window_by_streaming(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["rows"] == ROWS and out["found"] and out["equal"], "every row must come back as saved"
    bound = 8 * ROWS + 6 * WINDOW_BYTES + 2 * CHUNK + out["index"] + CONSTANT
    print(f"dcp.save peak RSS rise {out['save'] / 1e6:.0f} MB, dcp.load {out['load'] / 1e6:.0f} MB, "
          f"bound {bound / 1e6:.0f} MB, records {out['records'] / 1e6:.0f} MB")
    assert out["records"] > 2 * bound  # the test means something: holding the shard would break the bound
    for what in ("save", "load"):
        assert out[what] <= bound, (
            f"dcp.{what}'s peak RSS grew {out[what] / 1e6:.0f} MB for {out['records'] / 1e6:.0f} MB of records; "
            f"streaming holds at most {bound / 1e6:.0f} MB"
        )

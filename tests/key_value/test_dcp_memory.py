"""torch.distributed.checkpoint streams a KEY_VALUE table: in a fresh process (1-rank gloo group), a hash table of 1M
rows x 128 fp32 + row-wise Adagrad (516 MB of records, on disk below a tiny cache) is saved with ``dcp.save`` of the
stock ``state_dict()`` and ``fused_optimizer.state_dict()``, and loaded into a new model with ``dcp.load``. Each
one's peak RSS rise (``VmHWM``, reset before it) stays within the stated bound: 8 B per row of the shard (the IDs),
six windows (``WINDOW_BYTES``: the window read, its records and DCP's copy), two tier chunks (raw and decoded, while
the IDs are enumerated), the new disk index and a constant: under half the records.
Every sampled row reads back as saved (oracle: the function that generated the rows)."""

from memory_probe import run_fresh
from torchrec_ascend.checkpoint.sharded import WINDOW_BYTES

ROWS, DIM = 1_000_000, 128
CHUNK = 65536 * (DIM + 1) * 4  # one chunk of the tiers' rows (65,536 rows), read while the IDs are enumerated
CONSTANT = 32 << 20  # the interpreter's, allocator's and DCP's slack

SCRIPT = f"""
import torch.distributed.checkpoint as dcp
saved, store = key_value_model(os.path.join(root, "saved"), {ROWS}, {DIM}, load_factor=0.001)
fill(store, {ROWS})
width = store.width
checkpoint = os.path.join(root, "ckpt")
save = peak_rise(lambda: dcp.save({{"model": saved.state_dict(), "optim": saved.fused_optimizer.state_dict()}},
                                  checkpoint_id=checkpoint))
store.close()
del saved, store
loaded, store = key_value_model(os.path.join(root, "loaded"), {ROWS}, {DIM}, load_factor=0.001)
grown = peak_rise(lambda: dcp.load({{"model": loaded.state_dict(), "optim": loaded.fused_optimizer.state_dict()}},
                                   checkpoint_id=checkpoint))
sample = keys_at(0, {ROWS})[torch.randperm({ROWS})[:4096]]
got, found = store.get(sample)
print(json.dumps({{"save": save, "load": grown, "records": {ROWS} * width * 4, "rows": len(store),
                  "index": store.stats()["disk_index_bytes"], "found": bool(found.all()),
                  "equal": bool(torch.equal(got, rows_of(sample, width)))}}))
store.close()
"""


def test_dcp_saves_and_loads_a_key_value_table_larger_than_its_window_by_streaming(tmp_path):
    out = run_fresh(SCRIPT, tmp_path)
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

"""A KEY_VALUE shard larger than the memory a load may use restores by streaming: in a fresh process (1-rank gloo
group), a table of 1M rows x 128 fp32 + row-wise Adagrad (about 540 MB of saved records) on disk is saved and
loaded into a new model; the load's peak RSS (``VmHWM``, reset before it) grows by at most the bytes a load holds
per saved record, the new disk index, three blocks (one read ahead) and a constant (about 185 MB), under 40%
of the records, and every row reads back as saved (oracle: the function that generated them)."""

from memory_probe import run_fresh
from torchrec_ascend.checkpoint.restore import LOAD_BYTES_PER_RECORD

ROWS, DIM, CAPACITY = 1_000_000, 128, 1024
BLOCK = 65536 * (DIM + 1) * 4  # the rows of one saved block (the tier's chunks: 65,536 rows)
CONSTANT = 32 << 20  # the interpreter's and allocator's slack, the pool

SCRIPT = f"""
from torchrec_ascend import Saver
saved, store = key_value_model(os.path.join(root, "saved"), {CAPACITY}, {DIM}, load_factor=0.25)
fill(store, {ROWS})
width = store.width
Saver().save(saved, os.path.join(root, "ckpt"))
record_bytes = {ROWS} * (width * 4 + 24)
store.close()
del saved, store
loaded, store = key_value_model(os.path.join(root, "loaded"), {CAPACITY}, {DIM}, load_factor=0.25)
grown = peak_rise(lambda: Saver().load(loaded, os.path.join(root, "ckpt")))
sample = keys_at(0, {ROWS})[torch.randperm({ROWS})[:4096]]
got, found = store.get(sample)
print(json.dumps({{"grown": grown, "records": record_bytes, "rows": len(store),
                  "index": store.stats()["disk_index_bytes"], "found": bool(found.all()),
                  "equal": bool(torch.equal(got, rows_of(sample, width)))}}))
store.close()
"""


def test_a_shard_larger_than_the_load_may_use_restores_by_streaming(tmp_path):
    out = run_fresh(SCRIPT, tmp_path)
    assert out["rows"] == ROWS and out["found"] and out["equal"]
    bound = LOAD_BYTES_PER_RECORD * ROWS + out["index"] + 3 * BLOCK + CONSTANT
    assert out["records"] > 2.5 * bound  # the test means something: holding the records would break the bound
    assert out["grown"] <= bound, (
        f"the load's peak RSS grew {out['grown'] / 1e6:.0f} MB for {out['records'] / 1e6:.0f} MB of saved records; "
        f"a streaming load holds at most {bound / 1e6:.0f} MB"
    )

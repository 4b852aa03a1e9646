"""A bulk load leaves behind nothing but the index: the process's own RSS (in a fresh subprocess) after loading
4M rows into an empty DiskStore grows by the index and a constant, not by the 16 bytes a row held while loading
(freed as thousands of small per-partition pieces, which a fragmented C heap would otherwise keep resident)."""

import json
import os
import subprocess
import sys
import textwrap

ROWS = 4_000_000
CONSTANT = 24 << 20  # the segment maps' touched pages and the allocator's slack; the leak it guards is ~70 MB

SCRIPT = textwrap.dedent(
    f"""
    import json, tempfile
    import torch
    from torchrec_ascend.kernels.key_value.disk_store import DiskStore

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096

    def chunks(n, chunk=1 << 18):
        for first in range(0, n, chunk):
            keys = torch.arange(first, min(n, first + chunk)) * 2654435761 % (1 << 62)
            yield keys, torch.zeros(keys.numel(), 2)

    with tempfile.TemporaryDirectory() as directory:
        store = DiskStore(directory, 2, name="t")
        start = rss()
        store.bulk_load(chunks({ROWS}))
        grown = rss() - start
        print(json.dumps({{"grown": grown, "rows": len(store), "index": store.stats()["index_bytes"]}}))
        store.close()
    """
)


def test_rss_after_a_bulk_load_is_the_index_plus_a_constant():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["rows"] == ROWS
    assert out["index"] < 16 * ROWS
    assert out["grown"] - out["index"] <= CONSTANT, (
        f"RSS grew {out['grown'] / ROWS:.1f} B a row for an index of {out['index'] / ROWS:.1f} B a row"
    )

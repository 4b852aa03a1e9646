"""The host memory budget is a promise, checked with the process's own RSS (in a fresh subprocess).

A HostStore with a small budget over a DiskStore takes many times its budget in rows (puts, overwrites, gets that
promote, pops), and after every batch the process's resident memory (``VmRSS``, anonymous and file-backed pages:
the segment files' mapped pages count too) must stay within the promise::

    RSS - RSS at start <= host budget + disk index bytes (8 per bucket, <= 15 per disk key) + CONSTANT

``CONSTANT`` is one batch's temporaries and the indexes' fixed pages. The per-key memory of each tier is checked
too: the disk index under 16 bytes a key, the host tier under 24 bytes a key beyond its row.
"""

import json
import os
import subprocess
import sys
import textwrap

CONSTANT = 48 << 20

SCRIPT = textwrap.dedent(
    """
    import json, sys, tempfile
    import torch
    from torchrec_ascend.kernels.key_value.disk_store import DiskStore
    from torchrec_ascend.kernels.key_value.host_store import HostStore

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096

    width, keys_total, batch, budget = 16, 600_000, 8192, 4 << 20
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as directory:
        disk = DiskStore(directory, width, name="t", segment_bytes=4 << 20)
        store = HostStore(width, budget_bytes=budget, spill=disk, name="t")
        start, worst = rss(), 0
        for first in range(0, keys_total, batch):
            keys = torch.arange(first, first + batch) * 2654435761 % (1 << 62)
            store.put(keys, torch.randn(batch, width))
            old = torch.randint(0, first + batch, (batch,)) * 2654435761 % (1 << 62)
            store.get(old)  # promotes disk rows, spilling others
            if first % (8 * batch) == 0:
                rows, _ = store.pop(old[:256])  # rows leave the store, as the cache takes them ...
                store.put(old[:256], rows)  # ... and come back
            stats = store.stats()
            worst = max(worst, rss() - start - stats["host_bytes"] - stats["disk_index_bytes"])
        stats = store.stats()
        print(json.dumps({"worst_excess": worst, "start": start, "rows": len(store), **stats,
                          "row_bytes": store.row_bytes}))
        store.close()
    """
)


def test_rss_stays_within_the_host_budget_plus_the_disk_index_plus_a_constant():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert stats["rows"] == stats["host_rows"] + stats["disk_rows"] and stats["disk_rows"] > 10 * stats["host_rows"]
    assert stats["host_bytes"] <= stats["budget_bytes"]
    assert stats["worst_excess"] <= CONSTANT, f"RSS exceeded the promise by {stats['worst_excess'] - CONSTANT} bytes"
    assert stats["disk_index_bytes"] / stats["disk_rows"] < 16
    beyond_rows = stats["host_bytes"] - stats["host_rows"] * stats["row_bytes"]
    assert beyond_rows / stats["host_rows"] < 24

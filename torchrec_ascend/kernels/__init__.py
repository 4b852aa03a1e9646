"""Compute kernels of torchrec-ascend (above the hash tables, below the sharders).

* ``fused.py``: the FUSED hash kernels (table in device memory, optimizer fused into backward) and ``HashRows``, the
  raw-ID -> row machinery every hash kernel shares (slot tables, row init, prefetch and pinning, checkpoint export).
* ``dense.py``: data_parallel kernels (the CPU sequence fix, data_parallel hash tables).
* ``key_value/``: the KEY_VALUE kernel and its tiers (device cache, host store, disk store).
* ``walk.py``: finding the kernels inside a sharded model.

The native ops they call are :mod:`torchrec_ascend.native`; the ID map and slot tables :mod:`torchrec_ascend.hash`.
"""

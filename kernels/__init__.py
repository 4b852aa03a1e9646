"""Compute kernels and native ops of torchrec-ascend (import name ``torchrec_ascend.kernels``).

* ``csrc/``: C++ sources of the ``torch.ops.torchrec_ascend`` ops (schema, one file per dispatch key).
* ``ops.py``: Python wrappers and fake (meta) implementations; ``reference.py``: pure-Python oracles.
* ``id_map.py``: :class:`IdMap`, raw int64 ID -> slot, the core of every hash table.
* ``fused.py``: the FUSED hash kernels (table in device memory, optimizer fused into backward) and ``HashRows``, the
  raw-ID -> row machinery every hash kernel shares (slot tables, row init, prefetch and pinning, checkpoint export).
* ``dense.py``: data_parallel kernels (the CPU sequence fix, data_parallel hash tables).
* ``key_value/``: the KEY_VALUE kernel and its tiers (device cache, host store, disk store).
* ``walk.py``: finding the kernels inside a sharded model.
"""

"""Compute kernels and native ops of torchrec-ascend (import name ``torchrec_ascend.kernels``).

* ``csrc/``: C++ sources of the ``torch.ops.torchrec_ascend`` ops (schema, one file per dispatch key).
* ``ops.py``: Python wrappers and fake (meta) implementations; ``reference.py``: pure-Python oracles.
* ``id_map.py``: :class:`IdMap`, raw int64 ID -> slot, the core of every hash table.
* ``fused.py``: the FUSED kernel (table in device memory, optimizer fused into backward).
* ``key_value/``: the KEY_VALUE kernel and its tiers (device cache, host store, disk store).
"""

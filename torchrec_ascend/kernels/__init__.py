"""Compute kernels of torchrec-ascend (above the hash tables, below the sharders).

* ``fused.py``: the FUSED hash kernels (table in device memory, optimizer fused into backward) and ``HashRows``, the
  wiring every hash kernel shares (each kernel class is a constructor and a forward) of these parts:

  * the TBE adapter (:mod:`torchrec_ascend.adapters.tbe`): the only code touching the stock kernel's and fbgemm
    TBE's private fields (layout, weight/state views, the reserved row hidden, prefetch routed to the ID mapper);
  * ``pool.py``: the rows on the kernel's device (initial rows, the default row, rows packed with optimizer state);
  * ``row_tier.py``: where rows outside the pool live (``PoolOnly`` for FUSED and data_parallel; KEY_VALUE's
    ``key_value/tier.py``: host store spilling to disk);
  * ``id_mapper.py``: raw IDs -> rows, now or ahead in a prefetch, with the pins of the batches in flight and the lock;
  * ``shard_checkpoint.py``: the shards' checkpoint records (export, restore, shard info and state).
* ``transfers.py``: every copy between the host and a kernel's device, and the per-step budget.
* ``tbe_config.py``: the configs the TBE is built from (reserved row, cache-sized row blocks).
* ``dense.py``: data_parallel kernels (the CPU sequence fix, data_parallel hash tables).
* ``key_value/``: the KEY_VALUE kernel and its tiers (device cache, host store, disk store).
* ``walk.py``: finding the kernels inside a sharded model.

The native ops they call are :mod:`torchrec_ascend.native`; the ID map and slot tables :mod:`torchrec_ascend.hash`.
"""

"""Hash embedding tables: configs for raw 64-bit IDs, the ID map (``id_map.py``: raw ID -> slot over the native
ops), the per-shard slot table (slots, eviction and admission through the policies, change tracking) and the
unsharded hash modules. Above the native ops and the policies; the compute kernels build on it.
"""

"""Checkpoints of hash and KEY_VALUE tables: full and incremental, atomic, reshardable."""

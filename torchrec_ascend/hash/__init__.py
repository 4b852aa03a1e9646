"""Hash embedding tables: configs for raw 64-bit IDs and the unsharded hash modules."""

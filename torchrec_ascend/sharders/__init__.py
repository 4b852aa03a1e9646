"""Hybrid sharders: how stock DistributedModelParallel shards hash and plain tables."""

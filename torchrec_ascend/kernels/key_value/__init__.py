"""The KEY_VALUE kernel: a device cache over a host store over a disk store; rows carry optimizer state.

* :mod:`.kernel`: the kernels TorchRec builds for ``compute_kernels=["key_value"]`` and :func:`cache_metrics`.
* :mod:`.host_store` (memory, byte budget) over :mod:`.disk_store` (segment files with checksums):
  the tiers below the device cache; :mod:`.row_store`, :mod:`.key_index`, :mod:`.row_chunks`,
  :mod:`.segment_file`, :mod:`.disk_record` are their parts.
"""

from torchrec_ascend.kernels.key_value.kernel import KeyValueEmbedding, KeyValueEmbeddingBag, cache_metrics

__all__ = ["KeyValueEmbedding", "KeyValueEmbeddingBag", "cache_metrics"]

"""Native ops of torchrec-ascend (``torch.ops.torchrec_ascend``): the lowest layer, importing nothing of ours.

* ``ops.py``: Python wrappers and fake (meta) implementations; importing it loads ``_C``, the library built from
  the C++ sources in the repository's top-level ``kernels/csrc/`` (schema, one file per dispatch key).
* ``reference.py``: pure-Python oracles of every op, same signatures, bit for bit (the tests' reference).

Example::

    from torchrec_ascend.native import ops
    ranks = ops.hash_rank(ids, world_size)
"""

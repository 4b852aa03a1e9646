"""Small public data sets for examples, benchmarks and cache simulations (loaded as plain torch tensors).

Example::

    from torchrec_ascend.datasets import load_movielens_100k, leave_one_out
    data = load_movielens_100k()
    split = leave_one_out(data)
"""

from torchrec_ascend.datasets.movielens import (
    Interactions,
    UserSequences,
    default_cache_dir,
    leave_one_out,
    load_movielens_100k,
    parse_inter_file,
)

__all__ = [
    "Interactions",
    "UserSequences",
    "default_cache_dir",
    "leave_one_out",
    "load_movielens_100k",
    "parse_inter_file",
]

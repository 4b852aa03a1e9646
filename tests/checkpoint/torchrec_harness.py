"""TorchRec's own sharding test harness on KEY_VALUE tables (run as a script by test_torchrec_harness.py).

``ModelParallelTestShared._test_sharding`` builds TorchRec's TestSparseNN, shards it with DMP and the stock planner,
writes the unsharded model's weights into the sharded model's ``state_dict()`` tensors (``copy_``), trains both and
compares their outputs: TorchRec's own oracle, unchanged. Usage: ``python torchrec_harness.py KERNEL SHARDING``.

TorchRec's wheel leaves out ``torchrec.distributed.tests``, yet its ``test_sharding`` module imports one name from
it for the 2D-parallel path (not taken here). This script gives that name a stand-in that refuses to be used, at
its top level: the harness's worker processes come from a forkserver, which imports this script (``__main__``)
before it forks them, so they see the stand-in too.
"""

import sys
import types
import unittest


class _NotShipped:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError("torchrec.distributed.tests is not in TorchRec's wheel: this harness run has no "
                                  "EmbeddingCollection sharder of TorchRec's tests")


def _stand_in() -> None:
    for name in ("torchrec.distributed.tests", "torchrec.distributed.tests.test_sequence_model"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["torchrec.distributed.tests.test_sequence_model"].TestEmbeddingCollectionSharder = _NotShipped


_stand_in()

from fbgemm_gpu.split_embedding_configs import EmbOptimType  # noqa: E402  # after the stand-in
from torchrec.distributed.planner import ParameterConstraints  # noqa: E402
from torchrec.distributed.test_utils.emb_sharder import TestEBCSharder  # noqa: E402
from torchrec.distributed.test_utils.test_model_parallel import ModelParallelTestShared  # noqa: E402
from torchrec.distributed.types import CacheParams  # noqa: E402

KERNEL, SHARDING = "key_value", "table_wise"


class TorchRecHarness(ModelParallelTestShared):
    def setUp(self) -> None:
        super().setUp(backend="gloo")

    def test_sharding(self) -> None:
        sharder = TestEBCSharder(sharding_type=SHARDING, kernel_type=KERNEL,
                                 fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1})
        # TestSparseNN's tables have 10-60 rows and one of its batches touches most of a shard's rows, which a
        # device cache must hold at once: here the cache is the whole table (the rows still go in through the
        # KEY_VALUE tables' state_dict windows).
        extra = {"cache_params": CacheParams(load_factor=1.0)} if KERNEL == "key_value" else {}
        constraints = {f"table_{i}": ParameterConstraints(compute_kernels=[KERNEL], **extra) for i in range(6)}
        self._test_sharding(sharders=[sharder], backend="gloo", world_size=2, has_weighted_tables=False,
                            constraints=constraints)


if __name__ == "__main__":
    KERNEL, SHARDING = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)

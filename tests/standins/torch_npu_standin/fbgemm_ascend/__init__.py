"""STAND-IN for ``fbgemm_ascend``, for tests only: registers a PrivateUse1 kernel for a few ``fbgemm::`` ops.

The real package provides Ascend kernels for the fbgemm sparse ops; this one registers, for the ops in
:data:`NATIVE_OPS`, a kernel that raises if called (nothing can run on the stand-in "npu"). torchrec-ascend must
leave these ops alone and give the other ops its host round trip. ``FBGEMM_ASCEND_STANDIN_IMPORT_ERROR=<message>``
makes the import raise ``ImportError(<message>)``, as a build for another torch does (an undefined symbol).
"""

from __future__ import annotations

import os

_failure = os.environ.get("FBGEMM_ASCEND_STANDIN_IMPORT_ERROR")
if _failure:
    raise ImportError(_failure)

import fbgemm_gpu  # noqa: E402  (defines the fbgemm:: op schemas these kernels implement)
import fbgemm_gpu.split_table_batched_embeddings_ops_training  # noqa: E402,F401  (the TBE lookup ops)
import torch  # noqa: E402  (after the failure switch)

STANDIN = True
NATIVE_OPS = (
    "asynchronous_complete_cumsum",
    "permute_2D_sparse_data",
    # the device TBE lookups the npu profile calls (Adam looks up with the SGD one: kernels/fused_optimizers.py)
    "split_embedding_codegen_lookup_sgd_function_pt2",
    "split_embedding_codegen_lookup_adagrad_function_pt2",
    "split_embedding_codegen_lookup_rowwise_adagrad_function_pt2",
)


def _not_runnable(*args: object, **kwargs: object) -> None:
    raise RuntimeError("fbgemm_ascend stand-in kernels cannot run: there is no NPU in the tests")


_library = torch.library.Library("fbgemm", "IMPL")
for _name in NATIVE_OPS:
    _library.impl(_name, _not_runnable, "PrivateUse1")

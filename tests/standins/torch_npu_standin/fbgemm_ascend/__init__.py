"""STAND-IN for ``fbgemm_ascend``, for tests only: registers a PrivateUse1 kernel for a few ``fbgemm::`` ops.

The real package provides Ascend kernels for the fbgemm sparse ops; this one registers, for the ops in
:data:`NATIVE_OPS`, a kernel that raises if called (nothing can run on the stand-in "npu"). torchrec-ascend must
leave these ops alone and give the other ops its host round trip.
"""

from __future__ import annotations

import fbgemm_gpu  # noqa: F401  (defines the fbgemm:: op schemas these kernels implement)
import torch

STANDIN = True
NATIVE_OPS = ("asynchronous_complete_cumsum", "permute_2D_sparse_data")


def _not_runnable(*args: object, **kwargs: object) -> None:
    raise RuntimeError("fbgemm_ascend stand-in kernels cannot run: there is no NPU in the tests")


_library = torch.library.Library("fbgemm", "IMPL")
for _name in NATIVE_OPS:
    _library.impl(_name, _not_runnable, "PrivateUse1")

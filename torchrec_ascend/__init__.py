"""torchrec-ascend: a plugin backend for stock TorchRec.

Installing the package is enough: ``import torch`` loads our ``torch.backends`` entry point, which arms a lazy import
hook so TorchRec modules are patched as they are imported (see :mod:`torchrec_ascend.injection`). This module stays
import-light on purpose (it runs while ``torch`` itself is importing); the public names below load on first use.

Example::

    from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> defining module (PEP 562 lazy attributes keep `import torchrec_ascend` free of torch imports)
_LAZY = {
    "HashEmbeddingBagConfig": "torchrec_ascend.hash.configs",
    "HashEmbeddingConfig": "torchrec_ascend.hash.configs",
    "HashEmbeddingBagCollection": "torchrec_ascend.hash.modules",
    "HashEmbeddingCollection": "torchrec_ascend.hash.modules",
    "get_default_hybrid_sharders": "torchrec_ascend.sharders",
    "HybridTrainPipelineSparseDist": "torchrec_ascend.pipeline",
    "Saver": "torchrec_ascend.checkpoint",
    "doctor": "torchrec_ascend.cli.doctor",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchrec_ascend' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

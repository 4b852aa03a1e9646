"""torchrec-ascend: a plugin backend for stock TorchRec.

Installing the package is enough: ``import torch`` loads our ``torch.backends`` entry point, which arms a lazy import
hook so TorchRec modules are patched as they are imported (see :mod:`torchrec_ascend.injection`). This module stays
import-light on purpose (it runs while ``torch`` itself is importing); the public names below load on first use.

Example::

    from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
"""

from __future__ import annotations

from typing import Any

from torchrec_ascend.dotted import resolve_object

__version__ = "0.1.0"

# public name -> (defining module, attribute); PEP 562 lazy attributes keep `import torchrec_ascend` free of torch
_LAZY = {
    "HashEmbeddingBagConfig": ("torchrec_ascend.hash.configs", "HashEmbeddingBagConfig"),
    "HashEmbeddingConfig": ("torchrec_ascend.hash.configs", "HashEmbeddingConfig"),
    "HashEmbeddingBagCollection": ("torchrec_ascend.hash.modules", "HashEmbeddingBagCollection"),
    "HashEmbeddingCollection": ("torchrec_ascend.hash.modules", "HashEmbeddingCollection"),
    "get_default_hybrid_sharders": ("torchrec_ascend.sharders", "get_default_hybrid_sharders"),
    "HybridTrainPipelineSparseDist": ("torchrec_ascend.pipeline", "HybridTrainPipelineSparseDist"),
    "Saver": ("torchrec_ascend.checkpoint", "Saver"),
    "doctor": ("torchrec_ascend.cli.doctor", "report"),  # the `torchrec-ascend doctor` text
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'torchrec_ascend' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    return resolve_object(f"{module}:{attribute}")

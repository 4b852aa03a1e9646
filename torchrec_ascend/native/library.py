"""Loading the compiled library ``torchrec_ascend.native._C``, and what to say when it does not load.

A C++ extension links against the libtorch it was compiled with: on another torch it fails to load (undefined
symbols), or is absent in a source tree nobody built. :func:`load` turns either into one :class:`NativeLibraryError`
(an ``ImportError``) naming the torch this build was made for, the installed torch and the command that fixes it.
Only modules that call the ops load the library, so ``import torch`` and ``import torchrec`` still work and
``torchrec-ascend doctor`` shows the line from :func:`problem`.

A wheel records the torch it compiled against in ``built_for.py`` (written by ``setup.py``); the torch versions it
admits are its ``Requires-Dist``. A source (editable) build records nothing: it is rebuilt by ``scripts/setup-env``.

Example::

    from torchrec_ascend.native import library
    library.load()          # raises NativeLibraryError with the fix if the library cannot load
    library.problem()       # None, or that error's one-line message
"""

from __future__ import annotations

import importlib
import importlib.metadata
from types import ModuleType
from typing import Optional

DISTRIBUTION = "torchrec-ascend"
LIBRARY = "torchrec_ascend.native._C"


class NativeLibraryError(ImportError):
    """The native ops library cannot be loaded; the message says which torch it needs and how to fix it."""


def built_for() -> Optional[str]:
    """The torch version this install's library was compiled against (a wheel), or None (a source build)."""
    try:
        return str(importlib.import_module("torchrec_ascend.native.built_for").TORCH)
    except (ImportError, AttributeError):
        return None


def admitted_torch() -> Optional[str]:
    """The torch requirement of the installed distribution (``torch>=2.13,<2.15``), or None if not installed."""
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    return next((r.split(";")[0].replace(" ", "") for r in requires if r.replace(" ", "").startswith("torch>")
                 or r.replace(" ", "").startswith("torch=")), None)


def explain(err: BaseException) -> str:
    """One message for a failed load: what failed, the torch wanted and installed, and the fix."""
    import torch

    built = built_for()
    admitted = admitted_torch()
    if built is not None:
        want = f"this wheel was built for torch {built}" + (f" and admits {admitted}" if admitted else "")
        fix = (f"install the torch it needs (pip install '{admitted or f'torch=={built}'}'), or build "
               "torchrec-ascend for your torch from its source (pip install --no-build-isolation torchrec-ascend "
               "from the sdist or a checkout)")
    else:
        want = "this is a source build, compiled against the torch installed when it was built"
        fix = ("rebuild it against the installed torch: bash scripts/setup-env (a checkout), or "
               "pip install --no-build-isolation -e .")
    return (f"torchrec-ascend's native ops ({LIBRARY}) cannot be loaded on torch {torch.__version__}: "
            f"{type(err).__name__}: {err}. {want[0].upper()}{want[1:]}; fix: {fix}")


def load() -> ModuleType:
    """Import the library (registering ``torch.ops.torchrec_ascend``); :class:`NativeLibraryError` if it fails."""
    import torch  # noqa: F401  (loads libc10 and libtorch, which the library links against)

    try:
        return importlib.import_module(LIBRARY)
    except (ImportError, OSError) as err:
        raise NativeLibraryError(explain(err)) from err


def problem() -> Optional[str]:
    """None if the library loads, else :func:`load`'s message (for ``doctor``)."""
    try:
        load()
    except NativeLibraryError as err:
        return str(err)
    return None

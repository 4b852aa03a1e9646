"""What is wrong with the installed stack when ``import torchrec`` fails, in one line naming the command that fixes it.

TorchRec is installed with ``--no-deps`` (its metadata pulls the CUDA ``fbgemm-gpu``), so three install mistakes are
common and TorchRec's own error names none of their fixes: torchrec itself missing, one of TorchRec's dependencies
missing (they come with our device extra), and the CUDA ``fbgemm-gpu`` on a machine without CUDA (its library needs
the CUDA runtime: ``OSError: libcudart.so...``). :func:`explain` turns each into one line; the import hook adds it to
the exception as a note, and ``doctor`` prints it. Everything here is guarded: it runs while an import is failing.

Example::

    explain(ModuleNotFoundError("No module named 'torchrec'", name="torchrec"))
    # 'torchrec is not installed; fix: pip install --no-deps "torchrec==1.8.*" (--no-deps: its metadata asks
    #  for the CUDA fbgemm-gpu; the stack of torch 2.13)'
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import traceback
from typing import Optional

# torchrec's own dependencies, which `pip install --no-deps torchrec` leaves out and our device extras bring.
_TORCHREC_DEPENDENCIES = {"tensordict", "torchmetrics", "pyre_extensions", "iopath", "numpy", "fbgemm_gpu"}


def explain(err: BaseException) -> Optional[str]:
    """One line: what about the install made ``import torchrec`` fail, and the fix; None if it is none of ours.

    Example::

        try:
            import torchrec
        except Exception as err:
            print(explain(err) or err)
    """
    try:
        if isinstance(err, ModuleNotFoundError) and (err.name or "").split(".")[0] == "torchrec":
            return f"torchrec is not installed; fix: {_torchrec_install()}"
        if _from_fbgemm_gpu(err) and _cuda_fbgemm_without_cuda():
            fbgemm = _stack_field("fbgemm")
            pin = f"=={fbgemm}" if fbgemm else ""
            return (
                f"the CUDA build of fbgemm-gpu is installed on a machine without CUDA and cannot load ({err}); fix: "
                f'pip uninstall -y fbgemm-gpu fbgemm-gpu-cpu && pip install "fbgemm-gpu-cpu{pin}"'
            )
        top = (getattr(err, "name", None) or "").split(".")[0] if isinstance(err, ModuleNotFoundError) else ""
        if top in _TORCHREC_DEPENDENCIES:
            extra = _device_extra()
            return (
                f"torchrec needs {top}, which is not installed (torchrec installed with --no-deps leaves its "
                f'dependencies to our extras); fix: pip install "torchrec-ascend[{extra}]"'
            )
    except Exception:  # explaining must never hide the real error
        return None
    return None


def _torchrec_install() -> str:
    minor = _stack_field("torchrec")
    pin = f'"torchrec=={minor}.*"' if minor else "torchrec"
    stack = f"; the stack of torch {_torch_minor()}" if minor else ""
    return f"pip install --no-deps {pin} (--no-deps: its metadata asks for the CUDA fbgemm-gpu{stack})"


def _from_fbgemm_gpu(err: BaseException) -> bool:
    """True if the failure is fbgemm_gpu's own import (its module name, or a frame inside its package)."""
    if isinstance(err, ImportError) and (err.name or "").split(".")[0] == "fbgemm_gpu":
        return True
    frames = traceback.extract_tb(err.__traceback__)
    return isinstance(err, (OSError, ImportError)) and any("/fbgemm_gpu/" in f.filename for f in frames)


def _cuda_fbgemm_without_cuda() -> bool:
    try:
        importlib.metadata.version("fbgemm-gpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    import torch

    return not torch.cuda.is_available()  # a CPU torch, or a CUDA torch on a machine without a GPU


def _torch_minor() -> Optional[str]:
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    return ".".join(version.split("+")[0].split(".")[:2])


def _stack_field(field: str) -> Optional[str]:
    """``field`` of the version-table row pairing with the installed torch minor (None: no row, or no table)."""
    from torchrec_ascend import versions

    torch_minor = _torch_minor()
    return next((getattr(s, field) for s in versions.STACKS if s.torch == torch_minor), None)


def _device_extra() -> str:
    if importlib.util.find_spec("torch_npu") is not None:
        return "npu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"

"""Every public name of the package resolves, lazily (importing the package itself imports no torch)."""

import subprocess
import sys

import pytest

import torchrec_ascend


@pytest.mark.parametrize("name", [n for n in torchrec_ascend.__all__ if n != "__version__"])
def test_public_name_resolves(name: str) -> None:
    assert getattr(torchrec_ascend, name) is not None


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        torchrec_ascend.Nope  # noqa: B018  (the attribute access is what raises)


def test_importing_the_package_imports_no_torch() -> None:
    code = "import sys, torchrec_ascend; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"

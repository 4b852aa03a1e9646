"""Version requirements: which installed distribution meets a ``requires`` mapping, shared by the patch registry
and the adapters, so that a patch and an adapter written for the same versions are gated by the same code.

A ``requires`` mapping is distribution -> PEP 440 specifier (``{"torchrec": ">=1.8.0,<1.10"}``, usually one of
:mod:`torchrec_ascend.versions`' :data:`~torchrec_ascend.versions.TORCHREC` or
:data:`~torchrec_ascend.versions.TORCHREC_FBGEMM`); a key may list alternative distributions of one package
(``"fbgemm-gpu|fbgemm-gpu-cpu"``): the first installed one is checked.

Example::

    version_problem({"torchrec": ">=1.8,<1.9"}, {"torchrec": "1.9.0"})
    # 'torchrec 1.9.0 is outside the supported range >=1.8,<1.9'
"""

from __future__ import annotations

import importlib.metadata
from typing import Mapping, Optional, Tuple

from packaging.specifiers import SpecifierSet
from packaging.version import Version

#: Separates alternative distributions of one package in a ``requires`` key.
ALTERNATIVES = "|"


def installed_distribution(requirement: str) -> Optional[Tuple[str, str]]:
    """``(distribution, version)`` of the first installed alternative in a ``requires`` key, or None.

    Example::

        installed_distribution("fbgemm-gpu|fbgemm-gpu-cpu")   # ('fbgemm-gpu-cpu', '1.8.0') on this machine
    """
    for dist in requirement.split(ALTERNATIVES):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed_version(requirement: str) -> Optional[str]:
    """The installed version of a distribution (or of the first installed alternative ``"a|b"``), or None."""
    found = installed_distribution(requirement)
    return found[1] if found else None


def version_problem(requires: Mapping[str, str], versions: Mapping[str, Optional[str]]) -> Optional[str]:
    """Why ``requires`` is not met by ``versions`` (``requires`` key -> installed version), or None.

    Example::

        version_problem({"torchrec": ">=1.8,<1.9"}, {"torchrec": "1.9.0"})
        # 'torchrec 1.9.0 is outside the supported range >=1.8,<1.9'
    """
    for dist, spec in requires.items():
        have = versions.get(dist)
        if have is None:
            names = " nor ".join(dist.split(ALTERNATIVES))
            return f"{names} is not installed (needs {spec})"
        if Version(have) not in SpecifierSet(spec, prereleases=True):
            return f"{dist} {have} is outside the supported range {spec}"
    return None


def installed_problem(requires: Mapping[str, str]) -> Optional[str]:
    """:func:`version_problem` against the installed distributions.

    Example::

        installed_problem(versions.TORCHREC)   # None on a supported stack
    """
    return version_problem(requires, {dist: installed_version(dist) for dist in requires})


def newer_than(version: str, spec: str) -> bool:
    """True if ``version`` is above ``spec``'s upper bound while meeting its lower bounds.

    Example::

        newer_than("1.10.0", ">=1.8.0,<1.10")   # True
        newer_than("1.7.0", ">=1.8.0,<1.10")    # False: older
    """
    have, specifiers = Version(version), list(SpecifierSet(spec, prereleases=True))
    upper = [s for s in specifiers if s.operator in ("<", "<=")]
    lower = [s for s in specifiers if s.operator in (">", ">=")]
    return (
        any(not s.contains(have, prereleases=True) for s in upper)
        and all(s.contains(have, prereleases=True) for s in lower)
    )

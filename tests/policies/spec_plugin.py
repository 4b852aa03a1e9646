"""A plugin object for tests: its ``torchrec_ascend_policies`` hook returns whatever items it was given."""

from __future__ import annotations

from typing import Any, List

from torchrec_ascend.hookspecs import hookimpl
from torchrec_ascend.policies.base import PolicySpec


class SpecPlugin:
    """A plugin object whose ``torchrec_ascend_policies`` hook returns the given items (valid or not)."""

    def __init__(self, items: List[Any]) -> None:
        self.items = items

    @hookimpl
    def torchrec_ascend_policies(self) -> List[PolicySpec]:
        return self.items

"""Source of the throw-away modules the injection tests patch (never TorchRec): see ``new_target_module``."""

from __future__ import annotations

import textwrap

# A module of patch targets: plain functions, and a class with every kind of method (an inherited one too).
TARGET_SOURCE = textwrap.dedent(
    '''
    """Patch targets for the injection tests (written to a temporary folder, never TorchRec)."""

    def f0():
        return "f0"

    def f1():
        return "f1"

    def f2():
        return "f2"

    def f3():
        return "f3"

    def f4():
        return "f4"

    def f5():
        return "f5"

    class Base:
        @staticmethod
        def static():
            return "static"

        @classmethod
        def klass(cls):
            return cls.__name__

        def method(self):
            return "method"

    class Child(Base):
        pass
    '''
)
FUNCTIONS = ["f0", "f1", "f2", "f3", "f4", "f5"]

"""STAND-IN for ``torch_npu._C``, for tests only."""

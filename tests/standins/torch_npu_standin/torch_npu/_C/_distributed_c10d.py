"""STAND-IN for ``torch_npu._C._distributed_c10d``, for tests only: the HCCL process-group class, no collectives."""


class ProcessGroupHCCL:
    """Stand-in of the HCCL backend class (the real one is a pybind11 subclass of ``c10d.Backend``)."""

    class Options:
        """Stand-in of ``ProcessGroupHCCL.Options``."""

        def __init__(self) -> None:
            self.hccl_config: dict = {}

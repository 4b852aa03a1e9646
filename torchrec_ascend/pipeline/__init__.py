"""Training pipelines: :class:`HybridTrainPipelineSparseDist`, TorchRec's sparse-dist pipeline with its host stages
on threads and 1-12 batches in flight.

Example::

    from torchrec_ascend.pipeline import HybridTrainPipelineSparseDist
    pipeline = HybridTrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"), pipe_n_batch=3)
"""

from torchrec_ascend.pipeline.hybrid import HybridTrainPipelineSparseDist
from torchrec_ascend.pipeline.stages import PipelineStageError, Stage

__all__ = ["HybridTrainPipelineSparseDist", "PipelineStageError", "Stage"]

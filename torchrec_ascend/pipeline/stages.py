"""The stages of :class:`~torchrec_ascend.pipeline.HybridTrainPipelineSparseDist` and the error that names them.

A batch passes the stages in this order; every stage but ``COMPUTE`` runs on a host thread. The names follow
RecSDK's (``SPLIT``, ``FIRST_ALL2ALL``, ``SECOND_ALL2ALL``, ``POST_INPUT``, ``COPY2NPU``, ``COMPUTE``), except that
the device copy comes first and is called ``COPY2DEVICE``: TorchRec's input dist runs on the device's collective
backend, so the batch must be on the device before it is bucketized.

Example::

    try:
        pipeline.progress(batches)
    except PipelineStageError as err:
        print(err.stage, err.batch_index)   # Stage.LOAD 7
"""

from __future__ import annotations

import enum

from torchrec_ascend.errors import TorchRecAscendError


class Stage(str, enum.Enum):
    """One step of a batch's way through the pipeline."""

    LOAD = "LOAD"  # next(dataloader_iter)
    COPY2DEVICE = "COPY2DEVICE"  # batch.to(device)
    SPLIT = "SPLIT"  # each sharded module's input_dist: permute, bucketize, splits to send
    FIRST_ALL2ALL = "FIRST_ALL2ALL"  # splits all-to-all (how many lengths/IDs each rank gets); starts the second
    SECOND_ALL2ALL = "SECOND_ALL2ALL"  # wait for the lengths/IDs all-to-all and assemble the local KJTs
    POST_INPUT = "POST_INPUT"  # sharded modules' prefetch(): ID mapping, swap planning, swap-in
    COMPUTE = "COMPUTE"  # forward, backward, optimizer step (caller's thread)


class PipelineStageError(TorchRecAscendError, RuntimeError):
    """A stage raised while working on a batch; the original exception is ``__cause__``.

    Args:
        stage (Stage): the stage that raised.
        batch_index (int): index of the batch, counted from 0 over the pipeline's life.
        cause (BaseException): what the stage raised.
        detail (str): what happened to the other batches, and what to do.
    """

    def __init__(self, stage: Stage, batch_index: int, cause: BaseException, detail: str = "") -> None:
        self.stage = stage
        self.batch_index = batch_index
        message = f"stage {stage.value} failed on batch {batch_index}: {type(cause).__name__}: {cause}"
        super().__init__(f"{message}. {detail}" if detail else message)
        self.__cause__ = cause

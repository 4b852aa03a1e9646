"""Training pipelines: HybridTrainPipelineSparseDist with host stages on threads."""

"""Built-in policy plugins, registered through the torchrec_ascend entry-point group like any third party."""

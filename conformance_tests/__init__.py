"""The conformance suite: run on your own hardware with torchrec-ascend conformance, or through pytest."""

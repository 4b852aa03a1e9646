"""The torchrec-ascend command line: doctor, policies, conformance, cache-sim."""

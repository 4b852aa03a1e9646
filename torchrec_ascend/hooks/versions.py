"""The distribution versions each group of patches was written and tested against."""

# torchrec's private layout (kernel factory, sharder allow-lists, pipeline attributes) changes between minors.
TORCHREC_1_8 = {"torchrec": ">=1.8.0,<1.9"}

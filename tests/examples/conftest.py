"""Make the example folders importable: examples are scripts, not installed packages."""

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
for folder in (EXAMPLES / "movielens_hstu", EXAMPLES / "custom_policy"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

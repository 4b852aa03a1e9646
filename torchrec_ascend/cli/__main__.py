"""``python -m torchrec_ascend.cli``."""

import sys

from torchrec_ascend.cli import main

sys.exit(main())

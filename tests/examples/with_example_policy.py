"""Run a script with the example eviction policy plugin available, whether or not it is installed.

The main job's item table uses ``decayed_lfu`` from ``examples/custom_policy``, which ``scripts/run-main-job``
installs and the test environment may not have. This registers the module in-process under the name its entry
point declares, unless the entry point already loaded it, then runs the script as ``python SCRIPT ARGS`` would.

Usage (also as a torchrun target)::

    python tests/examples/with_example_policy.py examples/movielens_hstu/train.py --epochs 1
"""

import runpy
import sys
from pathlib import Path

EXAMPLE_POLICY = Path(__file__).resolve().parents[2] / "examples" / "custom_policy"
PLUGIN_NAME = "decayed_lfu"  # the entry-point name in examples/custom_policy/pyproject.toml


def main() -> None:
    sys.path.insert(0, str(EXAMPLE_POLICY))
    import decayed_lfu_policy
    from torchrec_ascend.plugin_manager import get_plugin_manager

    manager = get_plugin_manager()
    if PLUGIN_NAME not in {info.name for info in manager.plugins()}:
        manager.register(decayed_lfu_policy, PLUGIN_NAME)
    script = Path(sys.argv[1]).resolve()
    sys.argv = sys.argv[1:]
    sys.path.insert(0, str(script.parent))  # the script's folder first, as `python SCRIPT` puts it
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()

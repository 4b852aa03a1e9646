"""Print what ``torchrec-ascend doctor`` finds in a fresh process, as one JSON line (for the injection check).

Run as ``python -m torchrec_ascend.conformance_tests.injection.doctor_state`` with ``TORCHREC_ASCEND_DEVICE`` set
to the backend under test. The line holds ``problems`` (the doctor's; empty when healthy), ``text`` (its report),
``autoload`` (the entry point's state), ``selected`` (the active backend) and ``patches`` (name, state, detail).
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from torchrec_ascend import backends
    from torchrec_ascend.cli import doctor
    from torchrec_ascend.injection import autoload

    diagnosis = doctor.diagnose()
    registry = autoload.registry()
    statuses = registry.report() if registry else []
    patches = [{"name": s.patch.name, "state": s.state.value, "detail": s.detail} for s in statuses]
    print(json.dumps({
        "problems": diagnosis.problems,
        "text": diagnosis.text,
        "autoload": autoload.STATUS.state,
        "selected": backends.selection_status().selected,
        "patches": patches,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Saves killed with SIGKILL at random points leave the previous save loadable and intact; damaged files raise
StorageError naming the file. Oracle: a model trained as many steps without any save (see ``kill_saves.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

pytestmark = pytest.mark.multiprocess
HELPER = Path(__file__).with_name("kill_saves.py")
TRIALS = 4


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    work = tmp_path_factory.mktemp("kills")
    out = work / "results.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run(
        [sys.executable, str(HELPER), "--dir", str(work), "--trials", str(TRIALS), "--seed", "7", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0 and out.exists(), proc.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("trial", range(TRIALS))
def test_killed_save_leaves_previous_save_loadable(outcome: Dict[str, Any], trial: int) -> None:
    result = outcome["trials"][trial]
    # The latest complete save: at least the last one the child reported (under load the kill may land late).
    assert result["loaded"] >= result["last_reported"] >= 1, result
    assert result["same_rows"] and result["rows"] > 0, "the loaded rows differ from a model that never saved"
    assert result["incomplete_after"] == [], "the next save must clear the interrupted one"
    assert result["resumed_kind"] == "incremental" and result["resumed_chain"][-2] == result["loaded"], result
    assert result["resumed_same_rows"], "the increment written after resuming does not load back"


def test_kills_landed_inside_saves(outcome: Dict[str, Any]) -> None:
    inside = [t for t in outcome["trials"] if t["killed_in_save"] and t["incomplete_before"]]
    assert inside, "no kill interrupted a save: the trials prove nothing"


@pytest.mark.parametrize("damage", ["truncate_data", "flip_byte", "truncate_metadata"])
def test_damaged_file_raises_storage_error_naming_it(outcome: Dict[str, Any], damage: str) -> None:
    message = outcome["damaged"][damage]
    assert message.startswith("StorageError"), message
    assert outcome["damaged"][damage + "_file"] in message

"""A damaged or crafted checkpoint never leaves a 2-rank model half-loaded, trained or fresh (a fresh model's
KEY_VALUE tiers take the rows as they are checked): every rank raises a StorageError naming the file, and every
table shard on every rank is exactly as before (rows of every tier, optimizer state, slots, counters, step).
Oracle: the model's own snapshot before the load; the undamaged checkpoint does change it (to the saving model's
state), so the comparison has teeth. Runs ``atomic_loads.py`` on 2 gloo ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from torchrec_ascend.conformance_tests.launch import run_distributed

pytestmark = pytest.mark.multiprocess
SCRIPT = Path(__file__).with_name("atomic_loads.py")
DAMAGES = ["flip_latest", "flip_full", "path_escape", "bad_id_map", "truncate", "flip_plain", "negative_id"]
MODELS = ["trained", "fresh"]  # the order atomic_loads.py loads them in, for each damage


@pytest.fixture(scope="module")
def outcome() -> Dict[str, Any]:
    return run_distributed(SCRIPT, world_size=2, cases=[{"damage": d} for d in DAMAGES], timeout=600)


def test_the_undamaged_checkpoint_restores_the_saved_model(outcome: Dict[str, Any]) -> None:
    assert outcome["clean_load_restores_a"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_load_changes_nothing_and_names_the_file(outcome: Dict[str, Any], damage: str, model: str) -> None:
    result = outcome["results"][DAMAGES.index(damage) * len(MODELS) + MODELS.index(model)]
    assert (result["damage"], result["model"]) == (damage, model)
    for rank, r in enumerate(result["ranks"]):
        assert r["raised"] == "StorageError", f"rank {rank}: {r['raised'] or 'no error'}: {r['message']}"
        assert r["unchanged"], f"rank {rank}: the failed load changed the model: {r['message']}"
        assert result["file"] in r["message"], f"rank {rank}: the error does not name {result['file']}: {r['message']}"

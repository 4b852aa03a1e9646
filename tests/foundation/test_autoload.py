"""The ``torch.backends`` entry point in fresh interpreters: lazy, switchable, order-independent, never raising.

Oracle: the stock allow-list. Stock TorchRec refuses ``row_wise`` on CPU (``BaseEmbeddingSharder.sharding_types``);
the patched one offers it. Each child reports whether it does, plus the autoload state and the patch states.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future
from typing import Any, Dict

import pytest

from fresh_interpreter import start_all

# Appended to a child's program: what it reports about torchrec-ascend's state (EXTRA: more facts, a dict).
PROBE = """
from fresh_interpreter import report
from torchrec_ascend.injection import autoload
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
registry = autoload.registry()
report({
    "state": autoload.STATUS.state,
    "detail": autoload.STATUS.detail,
    "errors": autoload.STATUS.errors,
    "row_wise_on_cpu": "row_wise" in EmbeddingBagCollectionSharder().sharding_types("cpu"),
    "patches": {} if registry is None else {s.patch.name: s.state.value for s in registry.report()},
    **globals().get("EXTRA", {}),
})
"""

SWITCHED_OFF = """
import torch, torchrec
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec_ascend.injection import autoload
EXTRA = {"before": ["row_wise" in EmbeddingBagCollectionSharder().sharding_types("cpu"), autoload.STATUS.state,
                    autoload.registry() is None]}
autoload.activate()
"""

ARMING_FAILS = """
from torchrec_ascend.injection import import_hook
def broken(hook):
    raise OSError("simulated failure while arming")
import_hook.install = broken
import torch, torchrec
EXTRA = {"torch_works": torch.ones(2).sum().item() == 2.0}
"""

REGISTRY_FAILS = """
import torchrec_ascend.hooks as hooks
def broken():
    raise ImportError("simulated broken hook module")
hooks.default_patches = broken
import torch, torchrec
from torchrec_ascend.cli import doctor
diagnosis = doctor.diagnose()
EXTRA = {"doctor": diagnosis.text, "problems": diagnosis.problems}
"""

TORCH_ONLY = """
import sys, torch
from fresh_interpreter import report
from torchrec_ascend.injection import autoload, import_hook
report({"torchrec": sorted(m for m in sys.modules if m.split(".")[0] == "torchrec"),
        "state": autoload.STATUS.state,
        "hooked": any(isinstance(f, import_hook.TorchRecImportHook) for f in sys.meta_path)})
"""


@pytest.fixture(scope="module")
def children() -> Dict[str, "Future[Dict[str, Any]]"]:
    return start_all(
        {
            "torch_only": {"code": TORCH_ONLY},
            "torch_then_torchrec": {"code": "import torch, torchrec\n" + PROBE},
            "torchrec_first": {"code": "import torchrec\n" + PROBE},
            "off_ours": {"code": SWITCHED_OFF + PROBE, "env": {"TORCHREC_ASCEND_AUTOLOAD": "0"}},
            "off_torch": {"code": SWITCHED_OFF + PROBE, "env": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}},
            "arming_fails": {"code": ARMING_FAILS + PROBE},
            "registry_fails": {"code": REGISTRY_FAILS + PROBE},
        }
    )


def all_applied(facts: Dict[str, Any]) -> bool:
    return bool(facts["patches"]) and set(facts["patches"].values()) == {"applied"}


def test_import_torch_arms_the_hook_without_importing_torchrec(children: Dict[str, Future]) -> None:
    facts = children["torch_only"].result()
    assert facts["torchrec"] == []
    assert facts["state"] == "armed"
    assert facts["hooked"]


def test_importing_torchrec_after_torch_applies_every_patch(children: Dict[str, Future]) -> None:
    facts = children["torch_then_torchrec"].result()
    assert facts["state"] == "active"
    assert all_applied(facts), facts["patches"]
    assert facts["row_wise_on_cpu"]


def test_importing_torchrec_first_applies_every_patch(children: Dict[str, Future]) -> None:
    """torchrec imports torch itself, so the entry point runs while torchrec is mid-import."""
    facts = children["torchrec_first"].result()
    assert facts["state"] == "active", facts["detail"]
    assert all_applied(facts), facts["patches"]
    assert facts["row_wise_on_cpu"]


@pytest.mark.parametrize("child, state_before", [("off_ours", "disabled"), ("off_torch", "not loaded")])
def test_off_switch_leaves_torchrec_stock_until_activate(
    children: Dict[str, Future], child: str, state_before: str
) -> None:
    """Switched off: nothing is patched; ``activate()`` then patches the torchrec modules already imported."""
    facts = children[child].result()
    row_wise_before, state, no_registry = facts["before"]
    assert not row_wise_before, "switched off, TorchRec must be stock"
    assert state == state_before
    assert no_registry
    assert all_applied(facts), facts["patches"]
    assert facts["row_wise_on_cpu"]


def test_autoload_failure_is_recorded_not_raised(children: Dict[str, Future]) -> None:
    """A failure inside the entry point must not break ``import torch``; it is recorded for doctor."""
    facts = children["arming_fails"].result()
    assert facts["torch_works"]
    assert facts["state"] == "error"
    assert "simulated failure while arming" in facts["detail"]
    assert any("OSError" in e for e in facts["errors"])
    assert not facts["row_wise_on_cpu"], "a failed autoload must leave TorchRec stock"


def test_registry_failure_is_recorded_and_doctor_reports_it(children: Dict[str, Future]) -> None:
    """The patch registry failing to build leaves TorchRec importable and stock; doctor shows it as a problem."""
    facts = children["registry_fails"].result()
    assert facts["state"] == "error"
    assert "building the patch registry" in facts["detail"]
    assert not facts["row_wise_on_cpu"]
    assert facts["patches"] == {}
    assert "simulated broken hook module" in facts["doctor"]
    assert any("simulated broken hook module" in p for p in facts["problems"])


def _spawned_worker(queue: Any) -> None:
    """Runs in a spawned child: a fresh interpreter whose ``import torch`` runs the entry point again."""
    import torchrec  # noqa: F401  (the import is what arms the hook under test)
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    from torchrec_ascend.injection import autoload

    registry = autoload.registry()
    queue.put(
        {
            "state": autoload.STATUS.state,
            "row_wise_on_cpu": "row_wise" in EmbeddingBagCollectionSharder().sharding_types("cpu"),
            "patches": {} if registry is None else {s.patch.name: s.state.value for s in registry.report()},
        }
    )


def test_spawned_worker_is_patched(children: Dict[str, Future]) -> None:
    for future in children.values():  # let the fresh interpreters finish first: two cores
        future.exception()
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    worker = context.Process(target=_spawned_worker, args=(queue,))
    worker.start()
    try:
        facts = queue.get(timeout=120)
    finally:
        worker.join(timeout=60)
    assert worker.exitcode == 0
    assert facts["state"] == "active"
    assert all_applied(facts), facts["patches"]
    assert facts["row_wise_on_cpu"]

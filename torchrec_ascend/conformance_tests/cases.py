"""Which cases each conformance check runs on a device, derived from the device's backend profile.

A case is the JSON object one multi-process script receives (``params``), what the suite expects of its result
beyond the script's own numbers (``expect``), and, for a combination the device or the scripts do not cover, the
reason it is skipped (``skip``). Every function here is pure: the same profile, world size and ``quick`` give the
same cases, so the pytest collection and the check's single launch agree on them.

The sharding types per module are TorchRec 1.8.0's (its sharders' ``sharding_types``) and torchrec-ascend's hash
sharders' (``torchrec_ascend.sharders.HASH_SHARDING_TYPES``); a device gets those its profile lists.

Example::

    from torchrec_ascend.backends import profile_for
    [c.id for c in sharding_cases(profile_for("cpu"), world_size=2, quick=True)]
    # ['ebc-row_wise-rowwise_adagrad', 'ec-column_wise-adagrad']
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

#: Optimizers the scripts have an unsharded oracle for: script name -> fbgemm ``EmbOptimType`` name.
SCRIPT_OPTIMIZERS = {"sgd": "EXACT_SGD", "adagrad": "EXACT_ADAGRAD", "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD"}
#: The Adam optimizers the scripts have an oracle for (``TouchedRowsAdam``, the dict model's Adam) and the (module
#: kind, sharding type) cases each runs in the sharding, hash-table and KEY_VALUE checks: a few, not the whole grid
#: (the update is the same code for every sharding type; these cover rows split, columns split, pooled, sequence).
ADAM_OPTIMIZERS = {"adam": "ADAM", "partial_rowwise_adam": "PARTIAL_ROWWISE_ADAM"}
ADAM_GRID = {"adam": (("ebc", "row_wise"), ("ec", "column_wise"), ("ec", "table_wise")),
             "partial_rowwise_adam": (("ebc", "column_wise"),)}
#: Sharding types TorchRec 1.8.0 offers per module kind (``EmbeddingBagCollection``, ``EmbeddingCollection``).
STOCK_SHARDING_TYPES = {
    "ebc": ("data_parallel", "table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise",
            "grid_shard"),
    "ec": ("data_parallel", "table_wise", "column_wise", "row_wise"),
}
#: Sharding types of hash tables per module kind (torchrec-ascend's hybrid sharders).
HASH_SHARDING_TYPES = {
    "ebc": ("data_parallel", "table_wise", "column_wise", "table_column_wise", "row_wise"),
    "ec": ("data_parallel", "table_wise", "column_wise", "row_wise"),
}
#: Sharding types the KEY_VALUE and pipeline scripts build their models with.
KEY_VALUE_SHARDING_TYPES = {"ebc": ("row_wise", "table_wise", "column_wise"), "ec": ("row_wise", "table_wise")}
PIPELINE_SHARDING_TYPES = ("row_wise", "table_wise")
#: Compute kernels some check drives: ``fused`` (sharding, hash tables, pipeline), ``key_value``, and ``dense``
#: (data_parallel).
COVERED_KERNELS = ("fused", "key_value", "dense")
#: The full run's settings of stock modules, one case each on the first of the sharding types listed that the device
#: offers (EBC, row-wise Adagrad: fbgemm's VBE takes no other): setting -> (case keys, sharding types).
STOCK_VARIANTS: Dict[str, Tuple[Dict[str, Any], Tuple[str, ...]]] = {
    "variable": ({"batch": "variable"}, ("row_wise", "table_wise")),  # rank r has BATCH - 2r samples
    "empty": ({"batch": "empty"}, ("row_wise", "table_wise")),  # rank 0 has none
    "vbe": ({"batch": "vbe"}, ("row_wise", "table_row_wise", "table_wise")),
    "mean": ({"pooling": "mean"}, ("row_wise", "table_wise")),
    "weighted": ({"weighted": True}, ("row_wise", "table_wise")),
    "mixed": ({"dims": "mixed"}, ("column_wise", "row_wise", "table_wise")),
    "fp16": ({"dtype": "fp16"}, ("row_wise", "table_wise")),
    "int32": ({"index": "int32"}, ("row_wise", "table_wise")),
    "eval": ({"eval": True}, ("row_wise", "table_wise")),
}
#: The full run's stock pipelines against a plain loop: (pipeline, kernel); ``sparse_dist`` with FUSED is the quick
#: ``pipeline`` case.
STOCK_PIPELINES = (("sparse_dist", "key_value"), ("prefetch", "fused"), ("prefetch", "key_value"), ("eval", "fused"),
                   ("eval", "key_value"))
#: Types that split a table's columns (every world size) or its rows across ranks (two ranks or more).
COLUMN_SPLITS = {"column_wise", "table_column_wise", "grid_shard"}
ROW_SPLITS = {"row_wise", "table_row_wise", "grid_shard"}
#: A KEY_VALUE cache small enough to swap every batch: rows per shard, host budget in KiB (the rest goes to disk).
TINY_CACHE = {"cache_rows": 64, "host_kb": 8}
#: Parity variants (full run), each one case on the first row-wise Adagrad-row-wise case of a module kind: the hash
#: tables script's (against the unsharded module and the dict model) and the KEY_VALUE script's (against FUSED).
HASH_VARIANTS = {"ebc": ("mean", "weighted", "int32", "eval"), "ec": ("eval",)}
KEY_VALUE_VARIANTS = {"ebc": ("mean", "weighted", "mixed_dims", "fp16", "bf16", "int32", "vbe", "empty_rank", "eval"),
                      "ec": ("eval",)}
#: Pins are released after each batch's backward: KEY_VALUE behind HybridTrainPipelineSparseDist on one rank (a batch
#: that fails on one rank of several would leave the others waiting in a collective until the group's timeout), a
#: cache of 20 rows (a batch of ``plugin/key_value.py`` brings at most 19 distinct rows to a table, 11.5 on average),
#: at these depths (1 to 12 are supported: no overlap, the shallow ones and the deepest), for ``steps`` batches: a
#: pin that outlives its batch fills the cache within a few batches (a CapacityError).
PIN_RELEASE = {"cache_rows": 20, "host_kb": 8}
PIN_RELEASE_DEPTHS, PIN_RELEASE_STEPS = (1, 2, 3, 12), 200
#: KEY_VALUE behind the hybrid pipeline at depth 3, 2 ranks, with a cache that holds the batches in flight (a
#: row-wise shard sees about 12 of a table's IDs a batch) and still evicts, so every batch is prefetched on a lane:
#: what a step costs the compute thread is held to ``harness.TRANSFER_BUDGET["key_value_pipeline_compute_thread"]``
#: on the emulated NPU. The same run with FUSED hash tables behind the pipeline (``"kernel": "fused"``, no cache) is
#: held to ``fused_hash_pipeline_compute_thread``: their IDs are mapped on the lanes too.
COMPUTE_BUDGET = {"steps": 32, "depth": 3, "cache_rows": 96, "host_kb": 8, "budget": "compute_thread"}


@dataclasses.dataclass(frozen=True)
class Case:
    """One case of a check.

    Attributes:
        params (Dict[str, Any]): the JSON object the check's script receives (in order: the id is built from it).
        expect (Dict[str, Any]): what the suite expects of the result besides the script's own error bounds.
        skip (str): non-empty: the case is not run and is reported as skipped for this reason.

    Example::

        Case({"kind": "ebc", "sharding_type": "row_wise", "optimizer": "sgd"}, {"min_shards": 2}).id
        # 'ebc-row_wise-sgd'
    """

    params: Dict[str, Any]
    expect: Dict[str, Any] = dataclasses.field(default_factory=dict)
    skip: str = ""

    @property
    def id(self) -> str:
        """Test id: the parameter values joined by ``-``."""
        return "-".join(str(v) for v in self.params.values())


def _quick(cases: List[Case], preferred: Sequence[str]) -> List[Case]:
    """The ``preferred`` cases (by id) that the device runs, or else its first runnable case: one per area."""
    runnable = [c for c in cases if not c.skip]
    chosen = [c for c in runnable if c.id in preferred]
    return chosen or runnable[:1]


def _optimizers(profile: Any) -> Tuple[List[str], List[Case]]:
    """Script optimizers the device fuses, and skipped cases for every optimizer mismatch (either way)."""
    scripts = {**SCRIPT_OPTIMIZERS, **ADAM_OPTIMIZERS}
    supported = [name for name, fbgemm in scripts.items() if fbgemm in profile.fused_optimizers]
    skipped = [
        Case({"optimizer": name}, skip=f"{fbgemm} is not supported on {profile.device_type}")
        for name, fbgemm in scripts.items()
        if fbgemm not in profile.fused_optimizers
    ]
    skipped += [
        Case({"optimizer": fbgemm}, skip=f"no unsharded oracle for {fbgemm} in the conformance scripts yet")
        for fbgemm in profile.fused_optimizers
        if fbgemm not in scripts.values()
    ]
    return supported, skipped


def _variants(cases: List[Case], variants: Mapping[str, Sequence[str]]) -> List[Case]:
    """One case per variant on the first runnable row-wise Adagrad case of each module kind (row_wise preferred)."""
    out = []
    for kind, names in variants.items():
        base = [c for c in cases if not c.skip and c.params["kind"] == kind
                and c.params["optimizer"] == "rowwise_adagrad"]
        base.sort(key=lambda c: c.params["sharding_type"] != "row_wise")
        if base:
            out += [Case({**base[0].params, "variant": name}, base[0].expect) for name in names]
    return out


def _min_shards(sharding_type: str, world_size: int) -> int:
    """How many shards the plan must make of a table, so a split type cannot silently test table_wise."""
    if sharding_type in COLUMN_SPLITS or (sharding_type in ROW_SPLITS and world_size > 1):
        return 2
    return 1


def _grid(
    profile: Any, world_size: int, types: Mapping[str, Sequence[str]], extra: Callable[[str, str, str], Dict]
) -> List[Case]:
    """Every (module kind, sharding type the device supports, fused optimizer) case, plus the skipped ones."""
    optimizers, skipped = _optimizers(profile)
    cases = [
        Case({"kind": kind, "sharding_type": st, "optimizer": opt, **extra(kind, st, opt)},
             {"min_shards": _min_shards(st, world_size)})
        for kind, kind_types in types.items()
        for st in kind_types
        if st in profile.sharding_types
        for opt in optimizers
        if opt not in ADAM_GRID or (kind, st) in ADAM_GRID[opt]
    ]
    return cases + skipped


def _dcp_cases(profile: Any, world_size: int) -> List[Case]:
    """Stock DCP round trips of plain tables (``stock/sharding_matrix.py``): KEY_VALUE kept, onto fewer ranks, to and
    from FUSED, each where the device has the layouts."""
    spread = "row_wise" if world_size > 1 else "table_wise"
    layouts = [("ebc", spread, "key_value", spread, "key_value", world_size),
               ("ebc", "table_wise", "fused", spread, "key_value", world_size),
               ("ec", "table_wise", "key_value", "table_wise", "key_value", 1),  # onto fewer ranks: last (see the
               ("ebc", spread, "key_value", "table_wise", "fused", 1)]  # script's _first_ranks)
    keys = ("module", "sharding_type", "kernel", "load_sharding_type", "load_kernel", "load_world_size")
    if "EXACT_ROWWISE_ADAGRAD" not in profile.fused_optimizers:  # the script's optimizer
        return []
    return [Case({"kind": "dcp", **dict(zip(keys, layout))}) for layout in layouts
            if {layout[1], layout[3]} <= set(profile.sharding_types)
            and {layout[2], layout[4]} <= set(profile.compute_kernels)]


def sharding_cases(profile: Any, world_size: int, quick: bool) -> List[Case]:
    """Stock TorchRec modules sharded every way the device supports vs. the unsharded reference.

    Cases: every (``ebc``/``ec``, sharding type, optimizer) the device supports, stock ``TrainPipelineSparseDist``,
    ``DistributedModelParallel.copy()``; in full runs also the :data:`STOCK_VARIANTS` (batches that differ per rank,
    an empty one, VBE, mean pooling, weights, mixed dims, FP16, int32, eval), the :data:`STOCK_PIPELINES` and stock
    DCP round trips of KEY_VALUE tables; skipped: optimizers on one side only (device vs. scripts), compute kernels no
    check drives. ``quick``: one pooled row-wise and one sequence column-wise case.

    Example::

        len(sharding_cases(profile_for("cpu"), 2, quick=False))   # grid + pipeline + copy + 4 DCP + skipped
    """
    cases = _grid(profile, world_size, STOCK_SHARDING_TYPES, lambda *_: {})
    # The script's stock pipeline case shards row-wise, its copy case table-wise.
    cases += [Case({"kind": kind}) for kind, st in (("pipeline", "row_wise"), ("copy", "table_wise"))
              if st in profile.sharding_types]
    if quick:
        return _quick(cases, ("ebc-row_wise-rowwise_adagrad", "ec-column_wise-adagrad"))
    if "EXACT_ROWWISE_ADAGRAD" in profile.fused_optimizers:
        for setting, (keys, types) in STOCK_VARIANTS.items():
            offered = [t for t in types if t in profile.sharding_types][:1]
            cases += [Case({"kind": "ebc", "sharding_type": t, "optimizer": "rowwise_adagrad", "setting": setting,
                            **keys},  # the script reads the keys; "setting" names the case
                           {"min_shards": _min_shards(t, world_size)}) for t in offered]
    if "row_wise" in profile.sharding_types:  # the script's pipelines shard row-wise
        cases += [Case({"kind": "pipeline", "pipeline": p, "kernel": k}) for p, k in STOCK_PIPELINES
                  if k in profile.compute_kernels]
    cases += _dcp_cases(profile, world_size)
    cases += [
        Case({"kernel": kernel}, skip=f"no conformance script drives the {kernel} kernel yet")
        for kernel in profile.compute_kernels
        if kernel not in COVERED_KERNELS
    ]
    return cases


def hash_table_cases(profile: Any, world_size: int, quick: bool) -> List[Case]:
    """Hash tables sharded every way the device supports vs. the unsharded hash module and a dict model.

    The script picks the kernel: dense for data_parallel replicas, FUSED otherwise. The full run adds sequence
    tables sharded with ``use_index_dedup``, stock ``state_dict()`` round trips through
    torch.distributed.checkpoint (same plan per sharding type, and row_wise into table_wise), the
    :data:`HASH_VARIANTS` and the ADAM ``reused_row`` cases. ``quick``: one pooled
    row-wise case and one row-wise sequence case with index dedup, with the ``reused_row``, ``cadence`` and
    ``admission`` promise cases and the first two ``policy_steps`` ones.
    """
    cases = _grid(profile, world_size, HASH_SHARDING_TYPES, lambda *_: {})
    runnable = [c for c in cases if not c.skip and c.params["optimizer"] == "rowwise_adagrad"]
    dedup = [Case({**c.params, "dedup": "index_dedup"}, c.expect) for c in runnable if c.params["kind"] == "ec"]
    promises = reused_row_cases(profile) + cadence_cases(profile) + admission_cases(profile)
    steps = policy_step_cases(profile)
    if quick:
        return (_quick(cases, ("ebc-row_wise-rowwise_adagrad",))
                + _quick(dedup, ("ec-row_wise-rowwise_adagrad-index_dedup",)) + promises + steps[:2])
    state_dict = [Case({**c.params, "state_dict": c.params["sharding_type"]}) for c in runnable
                  if c.params["kind"] == "ebc"]
    # FUSED hash tables move between layouts through DCP too (row_wise saved, table_wise loaded)
    state_dict += [Case({**c.params, "state_dict": "table_wise"}) for c in runnable
                   if c.params["kind"] == "ebc" and c.params["sharding_type"] == "row_wise"
                   and "table_wise" in profile.sharding_types]
    adam = reused_row_cases(profile, "adam")
    return cases + dedup + state_dict + _variants(cases, HASH_VARIANTS) + promises + adam + steps


def policy_step_cases(profile: Any) -> List[Case]:
    """A table read by two features takes one policy step per batch (``plugin/policy_steps.py``): unsharded, then
    each hash kernel the device offers (FUSED, KEY_VALUE) on each of row_wise and table_wise it offers.

    Example::

        [c.id for c in policy_step_cases(profile_for("cpu"))][:2]
        # ['policy_steps-ebc-unsharded-fused', 'policy_steps-ebc-row_wise-fused']
    """
    types = [t for t in ("row_wise", "table_wise") if t in profile.sharding_types]
    kernels = [k for k in ("fused", "key_value") if k in profile.compute_kernels]
    return [Case({"promise": "policy_steps", "kind": "ebc", "sharding_type": st, "kernel": kernel})
            for st, kernel in [("unsharded", "fused"), *((st, k) for k in kernels for st in types)]]


def cadence_cases(profile: Any) -> List[Case]:
    """``eviction_cadence`` decides when a pool evicts, how much and which rows it protects
    (``plugin/cadence.py``): one table_wise case per hash kernel the device offers (FUSED, KEY_VALUE); in quick runs
    too.

    Example::

        [c.id for c in cadence_cases(profile_for("cpu"))]
        # ['cadence-ebc-table_wise-fused', 'cadence-ebc-table_wise-key_value']
    """
    kernels = [k for k in ("fused", "key_value") if k in profile.compute_kernels]
    why = "" if "table_wise" in profile.sharding_types else f"{profile.device_type} offers no table_wise sharding"
    return [Case({"promise": "cadence", "kind": "ebc", "sharding_type": "table_wise", "kernel": kernel}, skip=why)
            for kernel in kernels]


def admission_cases(profile: Any) -> List[Case]:
    """A rejected ID reads ``not_admitted_value`` and gets no row (``plugin/admission.py``): one table_wise case per
    hash kernel the device offers (FUSED, KEY_VALUE); in quick runs too.

    Example::

        [c.id for c in admission_cases(profile_for("cpu"))]
        # ['admission-ebc-table_wise-fused', 'admission-ebc-table_wise-key_value']
    """
    kernels = [k for k in ("fused", "key_value") if k in profile.compute_kernels]
    if "EXACT_ROWWISE_ADAGRAD" not in profile.fused_optimizers:  # the script's optimizer
        why = f"EXACT_ROWWISE_ADAGRAD is not supported on {profile.device_type}"
    elif "table_wise" not in profile.sharding_types:
        why = f"{profile.device_type} offers no table_wise sharding"
    else:
        why = ""
    return [Case({"promise": "admission", "kind": "ebc", "sharding_type": "table_wise", "kernel": kernel}, skip=why)
            for kernel in kernels]


def reused_row_cases(profile: Any, optimizer: str = "rowwise_adagrad") -> List[Case]:
    """A reused row starts with fresh optimizer state (``plugin/reused_rows.py``): one case per hash kernel the
    device offers (FUSED, KEY_VALUE), row-wise (else table-wise) sharding, with ``optimizer`` (``rowwise_adagrad``,
    in quick runs too, or ``adam``).

    Example::

        [c.id for c in reused_row_cases(profile_for("cpu"))]
        # ['reused_row-ebc-row_wise-fused-rowwise_adagrad', 'reused_row-ebc-row_wise-key_value-rowwise_adagrad']
    """
    types = [t for t in ("row_wise", "table_wise") if t in profile.sharding_types]
    kernels = [k for k in ("fused", "key_value") if k in profile.compute_kernels]
    cases = [Case({"promise": "reused_row", "kind": "ebc", "sharding_type": types[0] if types else "row_wise",
                   "kernel": kernel, "optimizer": optimizer})
             for kernel in kernels or ["fused"]]
    fused = {"rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD", "adam": "ADAM"}[optimizer]
    why = (f"{fused} (the optimizer state a reused row must not inherit) is not supported on "
           f"{profile.device_type}" if fused not in profile.fused_optimizers
           else "" if types and kernels else
           f"{profile.device_type} offers neither row_wise nor table_wise sharding with a hash kernel")
    return [dataclasses.replace(c, skip=why) for c in cases]


def key_value_cases(profile: Any, world_size: int, quick: bool) -> List[Case]:
    """KEY_VALUE with a tiny cache over host memory over disk vs. FUSED, bit for bit.

    Skipped as a whole when the device's profile has no ``key_value`` kernel. The full run adds one long case that
    must spill rows to disk, and the :data:`KEY_VALUE_VARIANTS`; both add the pin-release cases behind the hybrid
    pipeline (:func:`_pin_release_cases`). ``quick``: one pooled row-wise case, the same with ``load_factor=1.0``
    (the whole shard cached: no eviction) and one pin-release case.
    """
    if "key_value" not in profile.compute_kernels:
        return [Case({"kernel": "key_value"}, skip=f"the key_value kernel is not offered on {profile.device_type}")]
    steps = 12 if quick else 30  # the tiny cache is full after a few steps: both swap ways happen by step 12
    cases = _grid(profile, world_size, KEY_VALUE_SHARDING_TYPES, lambda *_: {"steps": steps, **TINY_CACHE})
    pins = _pin_release_cases(cases, quick)
    long = [c for c in cases if not c.skip and c.params["kind"] == "ebc" and c.params["sharding_type"] == "row_wise"
            and c.params["optimizer"] in SCRIPT_OPTIMIZERS]
    # load_factor=1.0: a cache of the shard's rows (plugin/key_value.py's tables hold 1024 rows) never swaps
    whole = [Case({**c.params, "cache_rows": 1024 // world_size}, {**c.expect, "whole_table": True}) for c in long[-1:]]
    pins += _compute_budget_case(cases)
    if quick:
        return _quick(cases, (f"ebc-row_wise-adagrad-{steps}-64-8",)) + whole + pins
    if long:
        params = {**long[-1].params, "steps": 400}
        cases.append(Case(params, {**long[-1].expect, "disk_rows": True}))
    cases += whole
    swapping = [c for c in cases if c.params.get("steps") != 400 and not c.expect.get("whole_table")]
    return cases + _variants(swapping, KEY_VALUE_VARIANTS) + pins


def _pipeline_optimizer(cases: List[Case]) -> Optional[str]:
    """The optimizer of the first runnable row-wise pooled case (row-wise Adagrad preferred), None if none runs."""
    base = [c for c in cases if not c.skip and c.params["kind"] == "ebc" and c.params["sharding_type"] == "row_wise"]
    base.sort(key=lambda c: c.params["optimizer"] != "rowwise_adagrad")
    return base[0].params["optimizer"] if base else None


def _pin_release_cases(cases: List[Case], quick: bool) -> List[Case]:
    """KEY_VALUE behind the hybrid pipeline with a cache barely larger than one batch (:data:`PIN_RELEASE`), at
    each of :data:`PIN_RELEASE_DEPTHS` (``quick``: depth 2, 40 batches), with :func:`_pipeline_optimizer`;
    ``expect["trained"]``: the batches that must train, ``expect["ranks"]``: 1 (the check launches them on one
    rank)."""
    optimizer = _pipeline_optimizer(cases)
    if optimizer is None:
        return []
    depths, steps = ((2,), 40) if quick else (PIN_RELEASE_DEPTHS, PIN_RELEASE_STEPS)
    return [
        Case({"kind": "pipeline", "sharding_type": "row_wise", "optimizer": optimizer, "steps": steps,
              "depth": depth, **PIN_RELEASE}, {"trained": steps, "ranks": 1})
        for depth in depths
    ]


def _compute_budget_case(cases: List[Case]) -> List[Case]:
    """KEY_VALUE, then FUSED, behind the hybrid pipeline on every rank, :data:`COMPUTE_BUDGET` (quick runs too)."""
    optimizer = _pipeline_optimizer(cases)
    if optimizer is None:
        return []
    key_value = {"kind": "pipeline", "sharding_type": "row_wise", "optimizer": optimizer, **COMPUTE_BUDGET}
    fused = {k: v for k, v in key_value.items() if k not in ("cache_rows", "host_kb")}
    return [Case(key_value, {"trained": COMPUTE_BUDGET["steps"]}),
            Case({**fused, "kernel": "fused"}, {"trained": COMPUTE_BUDGET["steps"], "prefetched": "every batch"})]


def pipeline_cases(profile: Any, world_size: int, quick: bool) -> List[Case]:
    """HybridTrainPipelineSparseDist vs. a plain training loop: equivalence at several depths, end of data, a
    failing stage, detach. ``expect["steps"]`` is how many batches must train. ``quick``: one equivalence case.
    """
    types = [t for t in PIPELINE_SHARDING_TYPES if t in profile.sharding_types]
    if not types:
        return [Case({"kind": "equivalence"}, skip=f"the pipeline script shards with {PIPELINE_SHARDING_TYPES}, "
                                                  f"none of which {profile.device_type} supports")]
    models = [("both", types[0]), ("ebc", types[0]), ("ec", types[-1])]
    depths = (3,) if quick else (1, 3, 6)
    cases = [
        Case({"kind": "equivalence", "model": model, "sharding_type": st, "depth": depth, "batches": 8},
             {"steps": 8})
        for model, st in models[:1 if quick else None]
        for depth in depths
    ]
    if quick:
        return cases
    cases += [
        Case({"kind": "end_of_data", "sharding_type": types[0], "batches": 3, "depth": 6, "execute_all_batches": True},
             {"steps": 3}),
        Case({"kind": "end_of_data", "sharding_type": types[0], "batches": 7, "depth": 3,
              "execute_all_batches": False}, {"steps": 5}),  # stock semantics: depth - 1 batches are left
        Case({"kind": "detach", "sharding_type": types[0], "depth": 4, "batches": 10, "detach_at": 5}, {"steps": 10}),
    ]
    if "row_wise" in profile.sharding_types:  # the failure cases build a row-wise model
        cases.append(Case({"kind": "raise", "where": "split", "at": 3, "depth": 3}, {"stage": "SPLIT"}))
    return cases


def error_cases(profile: Any, quick: bool) -> List[Case]:
    """Bad inputs to hash tables (``errors/bad_inputs.py``) and what each error message must name.

    ``expect``: ``raised`` (the exception class, or a base of it) and ``names`` (fragments the message must
    contain). ``quick``: the negative ID through the first sharded path, the full table, and the hand-written plan
    of a sharding type hash tables do not support.
    """
    names = {"table": "'item'", "feature": "'f_item'"}
    types = [t for t in ("table_wise", "row_wise") if t in profile.sharding_types]
    cases = [
        Case({"kind": "negative_id", "sharding_type": st},
             {"raised": "ValueError", "names": [names["table"], names["feature"], "non-negative"]})
        for st in ["unsharded", *types]
    ]
    cases += [
        Case({"kind": "full_table", "sharding_type": st},
             {"raised": "CapacityError", "names": [names["table"], "overflow='evict'"]})
        for st in ["unsharded", *types[:1]]
    ]
    cases.append(Case({"kind": "unknown_eviction_policy", "sharding_type": "unsharded"},
                      {"raised": "ConfigError", "names": [names["table"], "'lruu'", "did you mean 'lru'"]}))
    if "key_value" in profile.compute_kernels and types:
        cases.append(Case({"kind": "small_cache", "sharding_type": types[0], "cache_rows": 4},
                          {"raised": "CapacityError", "names": [names["table"], "load_factor"]}))
    if "table_row_wise" in profile.sharding_types:  # a sharding type hash tables do not support
        # The planner never proposes it for a hash table (its stock error names the table); a plan written by hand
        # is refused by ours.
        cases.append(Case({"kind": "unsupported_sharding", "sharding_type": "table_row_wise", "plan": "planner"},
                          {"raised": "RuntimeError", "names": ["item", "user provided constraints"]}))
        cases.append(Case({"kind": "unsupported_sharding", "sharding_type": "table_row_wise", "plan": "by_hand"},
                          {"raised": "ConfigError", "names": [names["table"], "table_row_wise", "row_wise"]}))
    if "row_wise" in types:
        cases.append(Case({"kind": "mixed_row_wise", "sharding_type": "row_wise"},
                          {"raised": "ConfigError", "names": [names["table"], "'user'", "HashEmbeddingBagConfig"]}))
    if quick:  # the first sharded path's first two, and the hand-written plan our sharding hooks refuse
        first = [c for c in cases if c.params["sharding_type"] == (types or ["unsharded"])[0]][:2]
        return first + [c for c in cases if c.params.get("plan") == "by_hand"]
    return cases


#: Installed policies that cannot be built without options: the options the full run checks them with.
EXAMPLE_POLICY_OPTIONS = {("eviction", "ttl"): {"ttl_steps": 3}}
#: The README's composition example, checked next to the installed policies when its components are installed.
COMPOSED_EXAMPLE = ("eviction", "ttl+lfu", {"ttl": {"ttl_steps": 3}})


def policy_cases(requested: Sequence[Tuple[str, Dict[str, Any]]], installed: Sequence[Tuple[str, str]]) -> List[Case]:
    """The policy contract cases: the ``requested`` policies, or else every ``installed`` one (per kind) and
    :data:`COMPOSED_EXAMPLE` (when its components are installed).

    Args:
        requested: ``(name, options)`` from ``--policy``; every kind the name exists as is checked.
        installed: ``(kind, name)`` of every installed policy.

    Returns:
        List[Case]: ``params`` ``{"policy": name[, "kind": kind]}``, ``expect["options"]`` the options to build with.

    Example::

        policy_cases([], [("eviction", "lru"), ("admission", "count")])[0].id   # 'lru-eviction'
    """
    if requested:
        return [Case({"policy": name}, {"options": options}) for name, options in requested]
    cases = [
        Case({"policy": name, "kind": kind}, {"options": EXAMPLE_POLICY_OPTIONS.get((kind, name), {})})
        for kind, name in installed
    ]
    kind, composed, options = COMPOSED_EXAMPLE
    if all((kind, part) in installed for part in composed.split("+")):
        cases.append(Case({"policy": composed, "kind": kind}, {"options": options}))
    return cases

"""Fused optimizers where fbgemm has no kernel for the table: ADAM and PARTIAL_ROWWISE_ADAM on the CPU and the NPU,
and every fused optimizer of BF16 tables there; applied in backward to the rows of the batch, in vectorized torch ops.

fbgemm's CPU TBE refuses ADAM and PARTIAL_ROWWISE_ADAM ("not supported in CPU mode": its CPU backward has no Adam),
has no BF16 forward (``"split_embedding_cpu_forward_2" not implemented for 'BFloat16'``), and the NPU's TBE runs
fbgemm's CPU kernels where fbgemm-ascend has none. For Adam, TorchRec's kernels are built here with a *carrier*
optimizer fbgemm accepts on every device (``EXACT_SGD``, no state, :func:`carrier_config`); then :func:`install` gives
the TBE the Adam states in fbgemm's own layout (``momentum1``: ``[rows, D]``; ``momentum2``: ``[rows, D]``, or
``[rows]`` for PARTIAL_ROWWISE_ADAM), so ``split_optimizer_states``, ``get_optimizer_state`` (``exp_avg``,
``exp_avg_sq``), TorchRec's fused optimizer, the pool's packed rows (weights, then each state: they travel with the
row through the host and disk tiers and checkpoints) and ``set_learning_rate`` work as for fbgemm's own optimizers.
A BF16 table with SGD or Adagrad is built by fbgemm as it is (weights BF16, states FP32). Either way the TBE's forward
becomes :class:`_FusedLookup`'s: fbgemm's own where it has one, else a gather and a scatter-add in torch ops (the
output in the TBE's ``output_dtype``, FP32 unless ``fused_params`` say otherwise, as TorchRec gives).

Each update is fbgemm's (``codegen/genscript/optimizers.py``), on each distinct row of the batch with the gradients
of its occurrences summed (fbgemm's "exact" semantics), rows absent from the batch untouched, in FP32::

    EXACT_SGD               w = w - lr * g
    EXACT_ADAGRAD           m = m + g * g;  w = w - lr * g / (sqrt(m) + eps)
    EXACT_ROWWISE_ADAGRAD   m = m + mean(g * g);  w = w - lr / (sqrt(m) + eps) * g
    ADAM                    m = beta1 * m + (1 - beta1) * g
                            v = beta2 * v + (1 - beta2) * g * g   (PARTIAL_ROWWISE_ADAM: mean over the row of g * g)
                            w = w - lr * ((m / (1 - beta1 ** iter)) / (sqrt(v / (1 - beta2 ** iter)) + eps) + wd * w)

Adam's ``iter`` is the TBE's step counter (fbgemm's ``iter``: +1 per training lookup, one per table group; the Saver
and ``fused_optimizer.state_dict()`` carry it), so bias correction is global as on CUDA, not per row;
``weight_decay`` is decoupled (AdamW) as in fbgemm's ADAM, whatever ``weight_decay_mode`` says. A BF16 weight is
rounded stochastically when the TBE's ``stochastic_rounding`` is set (fbgemm's default, as its CUDA kernels do:
round-to-nearest would drop every update below half a BF16 step), else to nearest. Not supported here (refused):
gradient clipping, ``use_rowwise_bias_correction``, and a weight decay mode for SGD and the Adagrads.

Every shape is fixed by the batch's sizes (no ``unique``, no host read of device data): the batch's indices are
sorted, each run of one row sums its gradients, and every occurrence writes its row's (identical) new values.

Example::

    config = stock_config(grouped_config, device)      # what the stock kernel constructor is given
    kernel = BatchedFusedEmbeddingBag(config, pg, device)
    finish(kernel, grouped_config, device)             # Adam states, and the lookup that applies the update
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torchrec.distributed.batched_embedding_kernel import EmbeddingFusedOptimizer
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig

from torchrec_ascend.adapters.tbe import TBE
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.kernels.transfers import to_device, to_host

#: Per fused optimizer this module applies, its fbgemm states and whether each is one value per row.
STATES: Dict[str, Tuple[Tuple[str, bool], ...]] = {
    "EXACT_SGD": (),
    "EXACT_ADAGRAD": (("momentum1", False),),
    "EXACT_ROWWISE_ADAGRAD": (("momentum1", True),),
    "ADAM": (("momentum1", False), ("momentum2", False)),
    "PARTIAL_ROWWISE_ADAM": (("momentum1", False), ("momentum2", True)),
}
#: The optimizers fbgemm's TBE has no CPU kernel for: this module applies them whatever the weights' precision.
ADAM = ("ADAM", "PARTIAL_ROWWISE_ADAM")
#: Weight precisions (TorchRec ``DataType`` names) fbgemm's CPU TBE cannot look up: this module trains them.
OWN_PRECISIONS = ("BF16",)
#: fbgemm's ``WeightDecayMode`` values this module applies to SGD and the Adagrads: NONE only. fbgemm's own CPU
#: EXACT_ROWWISE_ADAGRAD (1.8.0, measured) steps alike under NONE, L2 and DECOUPLE, so no oracle here checks a decay.
_DECAY_MODES = {0: "NONE"}
#: fbgemm's defaults for the hyper-parameters it reads (``SplitTableBatchedEmbeddingBagsCodegen``).
_DEFAULTS = {"learning_rate": 0.01, "eps": 1.0e-8, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.0}


def optimizer_name(fused_params: Optional[Dict[str, Any]]) -> Optional[str]:
    """The fused optimizer's fbgemm name (``"ADAM"``...) in ``fused_params``, or None when none is set."""
    optimizer = (fused_params or {}).get("optimizer")
    return None if optimizer is None else getattr(optimizer, "name", str(optimizer)).upper()


def _precision(config: GroupedEmbeddingConfig) -> str:
    return getattr(config.data_type, "name", str(config.data_type))


def trains(config: GroupedEmbeddingConfig, device: Optional[torch.device]) -> bool:
    """Whether this module trains ``config``: a FUSED or KEY_VALUE group on a device other than CUDA (fbgemm runs
    everything there), whose optimizer is an Adam or whose weights are BF16.

    Example::

        trains(config, torch.device("cpu"))   # True when config.fused_params["optimizer"] is ADAM
    """
    device_type = "cpu" if device is None else device.type
    fused = getattr(config.compute_kernel, "value", config.compute_kernel) in ("fused", "key_value")
    ours = optimizer_name(config.fused_params) in ADAM or _precision(config) in OWN_PRECISIONS
    return fused and ours and device_type not in ("cuda", "mtia")


def step_counter(kernel: Any) -> Optional[torch.Tensor]:
    """The step counter (fbgemm's ``iter`` buffer) of a kernel this module's Adam trains or whose BF16 weights it
    rounds stochastically, else None: checkpoints carry it, or bias correction (and the rounding noise) would start
    over after a load.

    Example::

        step_counter(kernel)   # tensor([12]) after 12 training lookups with ADAM
    """
    tbe = TBE(kernel)
    lookup = getattr(tbe.module.forward, "__self__", None)  # this module's lookup where it trains (install_on_tbe)
    stochastic = isinstance(lookup, _FusedLookup) and lookup.stochastic
    if optimizer_name(tbe.config.fused_params) not in ADAM and not stochastic:
        return None
    return getattr(tbe.module, "iter", None)


def check_hyper_parameters(fused_params: Optional[Dict[str, Any]], tables: Sequence[str],
                           precision: str = "FP32") -> None:
    """Refuse hyper-parameters this module cannot apply, naming the tables and the rule (at construction, not
    mid-training): those of an Adam, or of any optimizer of ``precision`` (a TorchRec ``DataType`` name) BF16.

    Raises:
        ConfigError: ``learning_rate < 0``, a beta outside ``[0, 1)``, ``eps <= 0``, ``weight_decay < 0``,
            gradient clipping, ``use_rowwise_bias_correction``, or (BF16 SGD and Adagrads) a ``weight_decay_mode``
            other than NONE (not implemented here).

    Example::

        check_hyper_parameters({"optimizer": EmbOptimType.ADAM, "beta1": 1.0}, ["t0"])   # ConfigError
    """
    name = optimizer_name(fused_params)
    if name not in ADAM and precision not in OWN_PRECISIONS:
        return
    fused_params = fused_params or {}
    params = {**_DEFAULTS, **{k: v for k, v in fused_params.items() if k in _DEFAULTS}}
    weights = f", {precision} weights" if precision in OWN_PRECISIONS else ""
    where = f"tables [{', '.join(tables)}] ({name or 'EXACT_SGD'}{weights})"
    rules = [
        ("learning_rate", params["learning_rate"] >= 0, "must be >= 0"),
        ("beta1", 0 <= params["beta1"] < 1, "must be in [0, 1)"),
        ("beta2", 0 <= params["beta2"] < 1, "must be in [0, 1)"),
        ("eps", params["eps"] > 0, "must be > 0"),
        ("weight_decay", params["weight_decay"] >= 0, "must be >= 0"),
    ]
    for key, ok, rule in rules:
        if not ok or not math.isfinite(params[key]):
            raise ConfigError(f"{where}: {key}={params[key]} {rule} (fused_params / the optimizer's arguments)")
    extra = fused_params.get("extra_optimizer_config")
    if fused_params.get("gradient_clipping") or getattr(extra, "use_rowwise_bias_correction", False):
        raise ConfigError(
            f"{where}: gradient_clipping and use_rowwise_bias_correction are not supported by the fused optimizers "
            "of the CPU and NPU backends; remove them (bias correction uses the table group's step counter, as on "
            "CUDA)"
        )
    mode = getattr(fused_params.get("weight_decay_mode"), "value", fused_params.get("weight_decay_mode", 0))
    if name not in ADAM and mode not in _DECAY_MODES:
        raise ConfigError(
            f"{where}: weight_decay_mode {fused_params['weight_decay_mode']} is not supported for BF16 tables by the "
            "CPU and NPU backends; remove it, or use FP32 or FP16 weights"
        )


def stock_config(config: GroupedEmbeddingConfig, device: Optional[torch.device]) -> GroupedEmbeddingConfig:
    """What a stock kernel constructor is given for ``config`` on ``device``: its carrier when this module trains
    it with an Adam (:func:`trains`), else ``config``; call :func:`finish` on the kernel built from it."""
    adam = optimizer_name(config.fused_params) in ADAM
    return carrier_config(config) if adam and trains(config, device) else config


def finish(kernel: Any, config: GroupedEmbeddingConfig, device: Optional[torch.device]) -> None:
    """:func:`install` ``config``'s optimizer in ``kernel`` (built from :func:`stock_config`) when this module trains
    it.

    Example::

        super().__init__(stock_config(config, device), pg, device)   # in a kernel class's constructor
        finish(self, config, device)
    """
    if trains(config, device):
        install(kernel, config)


def carrier_config(config: GroupedEmbeddingConfig) -> GroupedEmbeddingConfig:
    """``config`` with the Adam optimizer replaced by ``EXACT_SGD``, which fbgemm's TBE accepts on every device:
    what the stock kernel constructor is given (the carrier's backward never runs, see :func:`install`)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    fused = dict(config.fused_params or {})
    fused["optimizer"] = EmbOptimType.EXACT_SGD
    return dataclasses.replace(config, fused_params=fused)


def install(kernel: Any, config: GroupedEmbeddingConfig) -> None:
    """Make the TBE of ``kernel`` (built from :func:`stock_config` of ``config``) train with ``config``'s optimizer
    (:func:`install_on_tbe`); for an Adam, rebuild TorchRec's fused optimizer over its new states, ``config`` the
    kernel's config."""
    tbe = TBE(kernel)
    name = optimizer_name(config.fused_params) or "EXACT_SGD"
    install_on_tbe(tbe.module, name)
    if name in ADAM:
        tbe.replace_optimizer(config, EmbeddingFusedOptimizer(config, tbe.module, tbe.process_group))


def install_on_tbe(emb: Any, name: str) -> "_FusedLookup":
    """Make fbgemm's TBE ``emb`` train with fbgemm's optimizer ``name`` (one of :data:`STATES`) in its backward.

    For an Adam (``emb`` built with ``EXACT_SGD``), its states are allocated by fbgemm's own layout routine (zeros,
    the weights' placement) and the TBE's optimizer becomes ``name``, so every state reader sees fbgemm's Adam.
    Any other ``name`` is the one ``emb`` was built with (its states are fbgemm's).

    Example::

        tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=EmbOptimType.EXACT_SGD, beta1=0.8)
        install_on_tbe(tbe, "ADAM")
        tbe(indices, offsets).sum().backward()     # one Adam step on the rows of indices
    """
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import construct_split_state

    if name not in STATES:
        raise ConfigError(f"fused optimizers: {name!r} is not one of {list(STATES)}")
    if name in ADAM:
        for prefix, rowwise in STATES[name]:
            emb._apply_split(construct_split_state(emb.embedding_specs, rowwise=rowwise, cacheable=False),
                             prefix=prefix, dtype=torch.float32)
        emb.optimizer = EmbOptimType[name]
    lookup = _FusedLookup(emb, name)
    emb.forward = lookup.forward
    return lookup


def _flat(emb: Any, prefix: str) -> torch.Tensor:
    """The flat buffer of ``prefix`` (``weights``, ``momentum1``...) where its tables live (one placement for all)."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation

    placements = set(getattr(emb, f"{prefix}_physical_placements"))
    if len(placements) > 1:
        tables = getattr(emb, "table_names", None)
        raise ConfigError(f"fused Adam: the {prefix} of tables {tables} span several placements {sorted(placements)}")
    location = EmbeddingLocation(placements.pop()) if placements else EmbeddingLocation.HOST
    suffix = {EmbeddingLocation.HOST: "host", EmbeddingLocation.DEVICE: "dev"}.get(location, "uvm")
    return getattr(emb, f"{prefix}_{suffix}").data


class _Occurrences:
    """Per index of a lookup: its feature, its table's dim, its columns (past the dim, the last one repeated, masked
    by ``valid``), the flat positions of its row's elements in the weights and in the output, and its pooling scale
    (mean pooling; per-sample weights excluded)."""

    def __init__(self, feature: torch.Tensor, dim: torch.Tensor, col: torch.Tensor, valid: torch.Tensor,
                 w_pos: torch.Tensor, positions: torch.Tensor, scale: torch.Tensor) -> None:
        self.feature, self.dim, self.col, self.valid = feature, dim, col, valid
        self.w_pos, self.positions, self.scale = w_pos, positions, scale


class _FusedLookup:
    """The TBE's forward (fbgemm's, or a gather and a scatter-add for BF16), with the optimizer applied in its
    backward (see the module docstring).

    Args:
        emb: fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen`` (an Adam's carrier-built, its states installed).
        name: the fused optimizer's fbgemm name (a key of :data:`STATES`).

    Attributes:
        stochastic: BF16 weights rounded stochastically; the noise is drawn per step of fbgemm's ``iter``, which
            then counts training lookups as an Adam's does (and checkpoints carry it, see :func:`step_counter`).
    """

    def __init__(self, emb: Any, name: str) -> None:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

        self._emb = emb
        self.name = name
        self._trained_with = emb.optimizer
        self._carrier = EmbOptimType.EXACT_SGD  # an Adam's forward dispatches on it: the carrier takes no state
        self._pooled = emb.pooling_mode != PoolingMode.NONE
        self._mean = emb.pooling_mode == PoolingMode.MEAN
        self._output_dtype = SparseType.from_int(emb.output_dtype).as_dtype()
        device = emb.current_device
        table_of_feature = torch.tensor(emb.feature_table_map, dtype=torch.int64)
        prefixes = ("weights",) + tuple(prefix for prefix, _ in STATES[name])
        # Per table: element offsets of its rows in the flat weights and states, its dim; per feature, its table's.
        phys = {p: torch.tensor(getattr(emb, f"{p}_physical_offsets"), dtype=torch.int64) for p in prefixes}
        # The TBE never reallocates its weights or states: their flat buffers are taken once.
        self._flats = {p: _flat(emb, p) for p in phys}
        self._own_forward = self._flats["weights"].dtype == torch.bfloat16  # fbgemm's CPU TBE has none
        # Stochastic rounding's noise is drawn for the step the TBE counts: checkpoints carry the counter, so a
        # restored model rounds on exactly as the saved one would have.
        self.stochastic = self._own_forward and bool(emb.stochastic_rounding)
        self._stateful_step = name in ADAM or self.stochastic  # fbgemm's Adam counts steps in its forward
        dims = torch.tensor([spec[1] for spec in emb.embedding_specs], dtype=torch.int64)
        self._max_d = int(dims.max())
        self._dims = dims[table_of_feature].tolist()  # per feature, on the host (variable batches' layout)
        self._dim_of_feature = to_device(dims[table_of_feature], device)
        self._feature_offsets = {p: to_device(off[table_of_feature], device) for p, off in phys.items()}
        self._d_offsets = to_device(to_host(emb.D_offsets).long(), device)  # per feature, in the output
        self._total_d = int(emb.D_offsets[-1])

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: Optional[torch.Tensor] = None,
                feature_requires_grad: Optional[torch.Tensor] = None,
                batch_size_per_feature_per_rank: Optional[List[List[int]]] = None, **kwargs: Any) -> torch.Tensor:
        """The lookup (no autograd); in training, the optimizer in its backward (an Adam at ``iter + 1``)."""
        emb = self._emb
        training = torch.is_grad_enabled() and emb.training
        # What our lookup and the backward read (no copy of the indices when fbgemm looks up outside training).
        saved = _Saved(indices.long(), offsets.long(), per_sample_weights, None, batch_size_per_feature_per_rank
                       ) if training or self._own_forward else None

        def run() -> torch.Tensor:
            if saved is not None and self._own_forward:
                with torch.no_grad():
                    return self._lookup(saved)
            emb.optimizer = self._carrier
            try:
                with torch.no_grad():
                    return self._forward(indices=indices, offsets=offsets, per_sample_weights=per_sample_weights,
                                         feature_requires_grad=feature_requires_grad,
                                         batch_size_per_feature_per_rank=batch_size_per_feature_per_rank, **kwargs)
            finally:
                emb.optimizer = self._trained_with

        if not training or saved is None:
            return run()
        if self._stateful_step:
            emb.iter.add_(1)  # as fbgemm's forward does for its Adam (the device copy is the one checkpoints save)
            if isinstance(getattr(emb, "iter_cpu", None), torch.Tensor):
                emb.iter_cpu.add_(1)
            saved.step = emb.iter.clone()
        return _Backward.apply(emb.placeholder_autograd_tensor, per_sample_weights, run, self, saved)

    @property
    def _forward(self) -> Callable[..., torch.Tensor]:
        return type(self._emb).forward.__get__(self._emb)

    def _lookup(self, saved: "_Saved") -> torch.Tensor:
        """fbgemm's output for the lookup ``saved`` (same layout, the TBE's output dtype), from torch ops."""
        occ = self.occurrences(saved)
        scale = occ.scale if saved.per_sample_weights is None else occ.scale * saved.per_sample_weights.float()
        rows = self._flats["weights"][occ.w_pos].float() * scale.unsqueeze(1) * occ.valid
        n = saved.indices.numel()
        if not self._pooled:
            shape: Tuple[int, ...] = (n, self._max_d)
        elif saved.batch_size_per_feature_per_rank is None:
            shape = ((saved.offsets.numel() - 1) // max(1, self._dim_of_feature.numel()), self._total_d)
        else:
            sizes = saved.batch_size_per_feature_per_rank
            shape = (sum(sum(per_rank) * d for per_rank, d in zip(sizes, self._dims)),)
        out = torch.zeros(math.prod(shape), dtype=torch.float32, device=rows.device)
        out.index_add_(0, occ.positions.reshape(-1), rows.reshape(-1))
        return out.view(shape).to(self._output_dtype)

    # -- the layout of a lookup -----------------------------------------------------------------------------------

    def occurrences(self, saved: "_Saved") -> _Occurrences:
        """Where each index of the lookup ``saved`` reads and writes (see :class:`_Occurrences`)."""
        indices, offsets = saved.indices, saved.offsets
        n, device = indices.numel(), indices.device
        col = torch.arange(self._max_d, device=device).unsqueeze(0)
        num_features = self._dim_of_feature.numel()
        if not self._pooled:  # sequence: one output row per index, every table the same dim
            feature = torch.searchsorted(offsets, torch.arange(n, device=device), right=True) - 1
            feature = torch.div(feature, max(1, (offsets.numel() - 1) // num_features), rounding_mode="floor")
            positions = (torch.arange(n, device=device) * self._max_d).unsqueeze(1) + col
            scale = torch.ones(n, device=device)
        else:
            bag = torch.searchsorted(offsets, torch.arange(n, device=device), right=True) - 1
            bag_feature, bag_start = self._bag_layout(saved, offsets.numel() - 1, device)
            feature = bag_feature[bag]
            last = (self._dim_of_feature[feature] - 1).unsqueeze(1)
            positions = bag_start[bag].unsqueeze(1) + torch.minimum(col, last)
            scale = torch.ones(n, device=device)
            if self._mean:
                lengths = (offsets[1:] - offsets[:-1]).clamp(min=1).to(torch.float32)
                scale = 1.0 / lengths[bag]
        dim = self._dim_of_feature[feature]
        valid = col < dim.unsqueeze(1)
        cols = torch.minimum(col, (dim - 1).unsqueeze(1))
        w_pos = self._feature_offsets["weights"][feature].unsqueeze(1) + indices.unsqueeze(1) * dim.unsqueeze(1) + cols
        return _Occurrences(feature, dim, cols, valid, w_pos, positions, scale)

    def _bag_layout(self, saved: "_Saved", bags: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """Per bag: its feature and the flat position of its first output element."""
        num_features = self._dim_of_feature.numel()
        sizes = saved.batch_size_per_feature_per_rank
        if sizes is None:  # [B, total_D]: bags are feature-major
            batch = bags // max(1, num_features)
            bag = torch.arange(bags, device=device)
            feature = torch.div(bag, batch, rounding_mode="floor")
            return feature, (bag - feature * batch) * self._total_d + self._d_offsets[feature]
        # Variable batch: bags feature-major then rank; the output is rank-major, each (rank, feature) block
        # [its samples, D] flattened (built on the host from the host sizes, one copy up).
        dims = self._dims
        ranks = len(sizes[0]) if sizes else 0
        block_start, total = {}, 0
        for r in range(ranks):
            for f in range(num_features):
                block_start[(f, r)] = total
                total += sizes[f][r] * dims[f]
        counts = torch.tensor([sizes[f][r] for f in range(num_features) for r in range(ranks)], dtype=torch.int64)
        firsts = torch.tensor([block_start[(f, r)] for f in range(num_features) for r in range(ranks)])
        strides = torch.tensor([dims[f] for f in range(num_features) for r in range(ranks)])
        block = torch.repeat_interleave(torch.arange(counts.numel()), counts)
        within = torch.arange(block.numel()) - (torch.cumsum(counts, 0) - counts)[block]
        start = firsts[block] + within * strides[block]
        return to_device(block // max(1, ranks), device), to_device(start, device)

    # -- backward -----------------------------------------------------------------------------------------------------

    def backward(self, grad: torch.Tensor, saved: "_Saved") -> Optional[torch.Tensor]:
        """Apply the optimizer to the batch's rows; returns the per-sample weights' gradient (None without them)."""
        indices = saved.indices
        n = indices.numel()
        if n == 0:
            return None if saved.per_sample_weights is None else torch.zeros_like(saved.per_sample_weights)
        occ = self.occurrences(saved)
        grad_rows = grad.reshape(-1).float()[occ.positions] * occ.scale.unsqueeze(1)  # [n, max_d], unweighted
        w_old = self._flats["weights"][occ.w_pos].float()
        psw_grad = None
        if saved.per_sample_weights is not None:
            if saved.per_sample_weights.requires_grad:
                psw_grad = ((grad_rows * w_old) * occ.valid).sum(1).to(saved.per_sample_weights.dtype)
            grad_rows = grad_rows * saved.per_sample_weights.float().unsqueeze(1)
        # Rows across tables: a table's rows are distinct by their weights position of column 0.
        key = occ.w_pos[:, 0]
        order = torch.sort(key, stable=True).indices
        first = torch.ones(n, dtype=torch.bool, device=key.device)
        first[1:] = key[order][1:] != key[order][:-1]
        run = torch.cumsum(first.long(), 0) - 1  # per sorted occurrence, its row's run
        summed = torch.zeros(n, self._max_d, device=grad_rows.device).index_add_(0, run, grad_rows[order])
        g = torch.empty_like(summed)
        g[order] = summed[run]  # per occurrence, its row's summed gradient (past its dim, the last column's)
        leader = torch.empty_like(order)  # per occurrence, its row's first occurrence (the stable sort's first)
        leader[order] = torch.zeros_like(order).scatter_reduce_(0, run, order, "amin", include_self=False)[run]
        self._step(occ, indices, w_old, g, leader, saved.step)
        return psw_grad

    def _state_positions(self, prefix: str, occ: _Occurrences, indices: torch.Tensor) -> torch.Tensor:
        """Flat positions of the occurrences' rows in state ``prefix``: ``[n]`` row-wise, else ``[n, max_d]``."""
        start = self._feature_offsets[prefix][occ.feature]
        if dict(STATES[self.name])[prefix]:
            return start + indices
        return start.unsqueeze(1) + indices.unsqueeze(1) * occ.dim.unsqueeze(1) + occ.col

    def _step(self, occ: _Occurrences, indices: torch.Tensor, w: torch.Tensor, g: torch.Tensor,
              leader: torch.Tensor, step: Optional[torch.Tensor]) -> None:
        """One step of the optimizer on every occurrence's row (duplicates compute and write identical values)."""
        emb, args = self._emb, self._emb.optimizer_args
        lr, eps = emb.get_learning_rate(), args.eps
        dim = occ.dim.to(torch.float32)
        states = {p: self._state_positions(p, occ, indices) for p, _ in STATES[self.name]}
        if self.name == "EXACT_SGD":
            w_new = w - lr * g
        elif self.name == "EXACT_ADAGRAD":
            m = self._flats["momentum1"][states["momentum1"]] + g * g
            self._flats["momentum1"].index_put_((states["momentum1"],), m)
            w_new = w - lr * g / (torch.sqrt(m) + eps)
        elif self.name == "EXACT_ROWWISE_ADAGRAD":
            m = self._flats["momentum1"][states["momentum1"]] + (g * g * occ.valid).sum(1) / dim
            self._flats["momentum1"].index_put_((states["momentum1"],), m)
            w_new = w - (lr / (torch.sqrt(m) + eps)).unsqueeze(1) * g  # no decay: check_hyper_parameters
        else:
            w_new = self._adam(states, w, g, occ.valid, dim, step)
        self._write_weights(occ.w_pos, w_new, leader, step)

    def _adam(self, states: Dict[str, torch.Tensor], w: torch.Tensor, g: torch.Tensor, valid: torch.Tensor,
              dim: torch.Tensor, step: Optional[torch.Tensor]) -> torch.Tensor:
        """ADAM or PARTIAL_ROWWISE_ADAM: writes the moments, returns the new weights."""
        args, lr = self._emb.optimizer_args, self._emb.get_learning_rate()
        eps, beta1, beta2, decay = args.eps, args.beta1, args.beta2, args.weight_decay
        m1, m2 = self._flats["momentum1"], self._flats["momentum2"]
        m = beta1 * m1[states["momentum1"]] + (1 - beta1) * g
        if self.name == "PARTIAL_ROWWISE_ADAM":
            v_row = beta2 * m2[states["momentum2"]] + (1 - beta2) * (g * g * valid).sum(1) / dim
            v, v_stored = v_row.unsqueeze(1), v_row
        else:
            v = v_stored = beta2 * m2[states["momentum2"]] + (1 - beta2) * g * g
        assert step is not None  # an Adam's forward saves it
        step = step.to(torch.float64)
        correction1 = (1 - torch.pow(beta1, step)).to(torch.float32)
        correction2 = (1 - torch.pow(beta2, step)).to(torch.float32)
        m1.index_put_((states["momentum1"],), m)
        m2.index_put_((states["momentum2"],), v_stored)
        return w - lr * ((m / correction1) / (torch.sqrt(v / correction2) + eps) + decay * w)

    def _write_weights(self, w_pos: torch.Tensor, values: torch.Tensor, leader: torch.Tensor,
                       step: Optional[torch.Tensor]) -> None:
        """Store FP32 ``values`` at ``w_pos`` in the weights' precision (BF16: stochastically when the TBE says, the
        noise a hash of each row's first occurrence ``leader`` in the batch, its column and the lookup's ``step``)."""
        weights = self._flats["weights"]
        if self.stochastic:
            assert step is not None  # the forward saves it whenever rounding is stochastic
            values = stochastic_bf16(values, rounding_noise(leader, values.shape[1], step))
        weights.index_put_((w_pos,), values.to(weights.dtype))


def rounding_noise(leader: torch.Tensor, cols: int, round_: torch.Tensor) -> torch.Tensor:
    """Per ``leader`` (``[n]``) and column, 16 bits of noise hashed from both and ``round_`` (a one-element tensor):
    the same row gets the same noise however often it occurs, and the same batch the same noise whatever slots its
    rows have, so a KEY_VALUE table rounds as its FUSED twin does (bit for bit), with no random state to carry.

    Example::

        rounding_noise(torch.tensor([0, 0, 2]), 4, torch.ones(1, dtype=torch.int64))   # [3, 4] int32 in [0, 2**16)
    """
    col = torch.arange(cols, device=leader.device)
    x = leader.unsqueeze(1) * 0x9E3779B1 + col.unsqueeze(0) * 0x85EBCA77 + round_ * 0xC2B2AE3D
    for shift, multiplier in ((16, 0x7FEB352D), (15, 0x846CA68B), (16, 1)):  # a 32-bit integer hash's rounds
        x = ((x ^ (x >> shift)) * multiplier) & 0xFFFFFFFF
    return (x & 0xFFFF).to(torch.int32)


def stochastic_bf16(values: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """FP32 ``values`` rounded to BF16 up with the probability of the fraction BF16 drops (so small updates survive
    in expectation), given ``noise`` uniform in ``[0, 2**16)``: noise added below the 16 bits BF16 keeps, then
    truncation.

    Example::

        noise = torch.randint(0, 2 ** 16, (1000,), dtype=torch.int32)
        stochastic_bf16(torch.full((1000,), 1.0 + 2 ** -10), noise).float().mean()   # about 1 + 2 ** -10
    """
    bits = values.float().contiguous().view(torch.int32)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)


@dataclasses.dataclass
class _Saved:
    """What one training lookup's backward needs (its step on the device)."""

    indices: torch.Tensor
    offsets: torch.Tensor
    per_sample_weights: Optional[torch.Tensor]
    step: Optional[torch.Tensor]  # an Adam's step counter at this lookup
    batch_size_per_feature_per_rank: Optional[List[List[int]]]


class _Backward(torch.autograd.Function):
    """Autograd's link: the lookup's output depends on the TBE's placeholder (and the per-sample weights)."""

    @staticmethod
    def forward(ctx: Any, placeholder: torch.Tensor, per_sample_weights: Optional[torch.Tensor],
                run: Callable[[], torch.Tensor], lookup: _FusedLookup, saved: _Saved) -> torch.Tensor:
        ctx.lookup, ctx.saved = lookup, saved
        return run()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        psw_grad = ctx.lookup.backward(grad.contiguous(), ctx.saved)
        del ctx.saved
        return None, psw_grad, None, None, None

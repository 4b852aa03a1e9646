"""Fused ADAM and PARTIAL_ROWWISE_ADAM where fbgemm has no kernel for them (the CPU and the NPU): fbgemm's TBE
forward, then Adam applied in backward to the rows of the batch, in vectorized torch ops.

fbgemm's CPU TBE refuses ADAM and PARTIAL_ROWWISE_ADAM ("not supported in CPU mode": its CPU backward has no Adam),
and the NPU's TBE runs fbgemm's CPU kernels where fbgemm-ascend has none. TorchRec's kernels are built here with a
*carrier* optimizer fbgemm accepts on every device (``EXACT_SGD``, no state, :func:`carrier_config`); then
:func:`install` gives the TBE the Adam states in fbgemm's own layout (``momentum1``: ``[rows, D]``;
``momentum2``: ``[rows, D]``, or ``[rows]`` for PARTIAL_ROWWISE_ADAM), so ``split_optimizer_states``,
``get_optimizer_state`` (``exp_avg``, ``exp_avg_sq``), TorchRec's fused optimizer, the pool's packed rows (weights,
then each state: they travel with the row through the host and disk tiers and checkpoints) and ``set_learning_rate``
work as for fbgemm's own optimizers; and routes the TBE's forward through :class:`_AdamLookup`.

The update is fbgemm's CUDA ADAM (``codegen/genscript/optimizers.py``), on each distinct row of the batch with the
gradients of its occurrences summed (fbgemm's "exact" semantics), rows absent from the batch untouched::

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g            # PARTIAL_ROWWISE_ADAM: mean over the row's columns of g * g
    w = w - lr * ((m / (1 - beta1 ** iter)) / (sqrt(v / (1 - beta2 ** iter)) + eps) + weight_decay * w)

``iter`` is the TBE's step counter (fbgemm's ``iter``: +1 per training lookup, one per table group; the Saver and
``fused_optimizer.state_dict()`` carry it), so bias correction is global as on CUDA, not per row; ``weight_decay``
is decoupled (AdamW) as in fbgemm's ADAM, whatever ``weight_decay_mode`` says. Not supported here (refused):
gradient clipping and ``use_rowwise_bias_correction``.

Every shape is fixed by the batch's sizes (no ``unique``, no host read of device data): the batch's indices are
sorted, each run of one row sums its gradients, and every occurrence writes its row's (identical) new values.

Example::

    config = carrier_config(grouped_config)            # what the stock kernel constructor is given
    kernel = BatchedFusedEmbeddingBag(config, pg, device)
    install(kernel, grouped_config)                    # Adam states, and the lookup that applies Adam in backward
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

#: The fbgemm optimizers this module fuses, and whether each keeps its second moment per row.
ROWWISE_SECOND_MOMENT: Dict[str, bool] = {"ADAM": False, "PARTIAL_ROWWISE_ADAM": True}
#: fbgemm's defaults for the hyper-parameters it reads (``SplitTableBatchedEmbeddingBagsCodegen``).
_DEFAULTS = {"learning_rate": 0.01, "eps": 1.0e-8, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.0}


def optimizer_name(fused_params: Optional[Dict[str, Any]]) -> Optional[str]:
    """The fused optimizer's fbgemm name (``"ADAM"``...) in ``fused_params``, or None when none is set."""
    optimizer = (fused_params or {}).get("optimizer")
    return None if optimizer is None else getattr(optimizer, "name", str(optimizer)).upper()


def is_fused_adam(config: GroupedEmbeddingConfig, device: Optional[torch.device]) -> bool:
    """Whether this module trains ``config`` (a FUSED or KEY_VALUE group whose fused optimizer is an Adam fbgemm
    cannot run on ``device``): fbgemm runs its own on CUDA; everywhere else (the CPU, the NPU) :func:`install` does.

    Example::

        is_fused_adam(config, torch.device("cpu"))   # True when config.fused_params["optimizer"] is ADAM
    """
    device_type = "cpu" if device is None else device.type
    fused = getattr(config.compute_kernel, "value", config.compute_kernel) in ("fused", "key_value")
    adam = optimizer_name(config.fused_params) in ROWWISE_SECOND_MOMENT
    return fused and adam and device_type not in ("cuda", "mtia")


def step_counter(kernel: Any) -> Optional[torch.Tensor]:
    """The step counter (fbgemm's ``iter`` buffer) of a kernel this module's Adam trains, else None: checkpoints
    carry it, or bias correction would start over after a load.

    Example::

        step_counter(kernel)   # tensor([12]) after 12 training lookups with ADAM
    """
    tbe = TBE(kernel)
    if optimizer_name(tbe.config.fused_params) not in ROWWISE_SECOND_MOMENT:
        return None
    return getattr(tbe.module, "iter", None)


def check_hyper_parameters(fused_params: Optional[Dict[str, Any]], tables: Sequence[str]) -> None:
    """Refuse Adam hyper-parameters out of range, naming the tables and the rule (at construction, not mid-training).

    Raises:
        ConfigError: ``learning_rate < 0``, a beta outside ``[0, 1)``, ``eps <= 0``, ``weight_decay < 0``,
            gradient clipping or ``use_rowwise_bias_correction`` (not implemented here).

    Example::

        check_hyper_parameters({"optimizer": EmbOptimType.ADAM, "beta1": 1.0}, ["t0"])   # ConfigError
    """
    name = optimizer_name(fused_params)
    if name not in ROWWISE_SECOND_MOMENT:
        return
    params = {**_DEFAULTS, **{k: v for k, v in (fused_params or {}).items() if k in _DEFAULTS}}
    where = f"tables [{', '.join(tables)}] ({name})"
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
    extra = (fused_params or {}).get("extra_optimizer_config")
    if (fused_params or {}).get("gradient_clipping") or getattr(extra, "use_rowwise_bias_correction", False):
        raise ConfigError(
            f"{where}: gradient_clipping and use_rowwise_bias_correction are not supported by the fused Adam of "
            "the CPU and NPU backends; remove them (bias correction uses the table group's step counter, as on CUDA)"
        )


def stock_config(config: GroupedEmbeddingConfig, device: Optional[torch.device]) -> GroupedEmbeddingConfig:
    """What a stock kernel constructor is given for ``config`` on ``device``: its carrier when this module trains
    it (:func:`is_fused_adam`), else ``config``; call :func:`finish` on the kernel built from it."""
    return carrier_config(config) if is_fused_adam(config, device) else config


def finish(kernel: Any, config: GroupedEmbeddingConfig, device: Optional[torch.device]) -> None:
    """:func:`install` ``config``'s Adam in ``kernel`` (built from :func:`stock_config`) when this module trains it.

    Example::

        super().__init__(stock_config(config, device), pg, device)   # in a kernel class's constructor
        finish(self, config, device)
    """
    if is_fused_adam(config, device):
        install(kernel, config)


def carrier_config(config: GroupedEmbeddingConfig) -> GroupedEmbeddingConfig:
    """``config`` with the Adam optimizer replaced by ``EXACT_SGD``, which fbgemm's TBE accepts on every device:
    what the stock kernel constructor is given (the carrier's backward never runs, see :func:`install`)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    fused = dict(config.fused_params or {})
    fused["optimizer"] = EmbOptimType.EXACT_SGD
    return dataclasses.replace(config, fused_params=fused)


def install(kernel: Any, config: GroupedEmbeddingConfig) -> None:
    """Make the TBE of ``kernel`` (built from :func:`carrier_config` of ``config``) train with ``config``'s Adam
    (:func:`install_on_tbe`), and rebuild TorchRec's fused optimizer over its states, ``config`` the kernel's config.
    """
    tbe = TBE(kernel)
    install_on_tbe(tbe.module, optimizer_name(config.fused_params) or "")
    tbe.replace_optimizer(config, EmbeddingFusedOptimizer(config, tbe.module, tbe.process_group))


def install_on_tbe(emb: Any, name: str) -> "_AdamLookup":
    """Give fbgemm's TBE ``emb`` (built with ``EXACT_SGD``) the states of fbgemm's ``name`` (``"ADAM"`` or
    ``"PARTIAL_ROWWISE_ADAM"``) and a forward that applies it in backward.

    The states are allocated by fbgemm's own layout routine (zeros, the weights' placement) and the TBE's optimizer
    becomes ``name``, so every state reader sees fbgemm's Adam.

    Example::

        tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=EmbOptimType.EXACT_SGD, beta1=0.8)
        install_on_tbe(tbe, "ADAM")
        tbe(indices, offsets).sum().backward()     # one Adam step on the rows of indices
    """
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import construct_split_state

    if name not in ROWWISE_SECOND_MOMENT:
        raise ConfigError(f"fused Adam: {name!r} is not one of {list(ROWWISE_SECOND_MOMENT)}")
    for prefix, rowwise in (("momentum1", False), ("momentum2", ROWWISE_SECOND_MOMENT[name])):
        emb._apply_split(construct_split_state(emb.embedding_specs, rowwise=rowwise, cacheable=False),
                         prefix=prefix, dtype=torch.float32)
    emb.optimizer = EmbOptimType[name]
    lookup = _AdamLookup(emb, rowwise=ROWWISE_SECOND_MOMENT[name])
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


class _AdamLookup:
    """The TBE's forward, with Adam applied in its backward (see the module docstring).

    Args:
        emb: fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen`` (carrier-built, Adam states installed).
        rowwise: PARTIAL_ROWWISE_ADAM (one second moment per row).
    """

    def __init__(self, emb: Any, rowwise: bool) -> None:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

        self._emb = emb
        self._adam = emb.optimizer
        self._carrier = EmbOptimType.EXACT_SGD
        self._forward = type(emb).forward.__get__(emb)
        self.rowwise = rowwise
        self._pooled = emb.pooling_mode != PoolingMode.NONE
        self._mean = emb.pooling_mode == PoolingMode.MEAN
        device = emb.current_device
        table_of_feature = torch.tensor(emb.feature_table_map, dtype=torch.int64)
        # Per table: element offsets of its rows in the flat weights and states, its dim; per feature, its table's.
        phys = {p: torch.tensor(getattr(emb, f"{p}_physical_offsets"), dtype=torch.int64)
                for p in ("weights", "momentum1", "momentum2")}
        # The TBE never reallocates its weights or states: their flat buffers are taken once.
        self._flats = {p: _flat(emb, p) for p in phys}
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
        """fbgemm's forward (the carrier's, no autograd); in training, Adam in its backward at ``iter + 1``."""
        def run() -> torch.Tensor:
            emb = self._emb
            emb.optimizer = self._carrier  # the forward dispatches on it; the carrier's lookup takes no state
            try:
                with torch.no_grad():
                    return self._forward(indices=indices, offsets=offsets, per_sample_weights=per_sample_weights,
                                         feature_requires_grad=feature_requires_grad,
                                         batch_size_per_feature_per_rank=batch_size_per_feature_per_rank, **kwargs)
            finally:
                emb.optimizer = self._adam

        emb = self._emb
        if not (torch.is_grad_enabled() and emb.training):
            return run()
        emb.iter.add_(1)  # as fbgemm's forward does for its Adam (the device copy is the one checkpoints save)
        if isinstance(getattr(emb, "iter_cpu", None), torch.Tensor):
            emb.iter_cpu.add_(1)
        saved = _Saved(indices.long(), offsets.long(), per_sample_weights, emb.iter.clone(),
                       batch_size_per_feature_per_rank)
        return _Backward.apply(emb.placeholder_autograd_tensor, per_sample_weights, run, self, saved)

    # -- backward -----------------------------------------------------------------------------------------------------

    def element_positions(self, saved: "_Saved") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per index: its feature, the flat positions of its gradient in the output ``[n, max_d]`` (columns past
        its table's dim repeat the last one) and its scale (mean pooling, per-sample weight excluded)."""
        indices, offsets = saved.indices, saved.offsets
        n, device = indices.numel(), indices.device
        col = torch.arange(self._max_d, device=device)
        num_features = self._dim_of_feature.numel()
        if not self._pooled:  # sequence: one output row per index, every table the same dim
            feature = torch.searchsorted(offsets, torch.arange(n, device=device), right=True) - 1
            feature = torch.div(feature, max(1, (offsets.numel() - 1) // num_features), rounding_mode="floor")
            starts = torch.arange(n, device=device) * self._max_d
            return feature, starts.unsqueeze(1) + col, torch.ones(n, device=device)
        bag = torch.searchsorted(offsets, torch.arange(n, device=device), right=True) - 1
        bag_feature, bag_start = self._bag_layout(saved, offsets.numel() - 1, device)
        feature = bag_feature[bag]
        dim = self._dim_of_feature[feature]
        positions = bag_start[bag].unsqueeze(1) + torch.minimum(col.unsqueeze(0), (dim - 1).unsqueeze(1))
        scale = torch.ones(n, device=device)
        if self._mean:
            lengths = (offsets[1:] - offsets[:-1]).clamp(min=1).to(torch.float32)
            scale = 1.0 / lengths[bag]
        return feature, positions, scale

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

    def backward(self, grad: torch.Tensor, saved: "_Saved") -> Optional[torch.Tensor]:
        """Apply Adam to the batch's rows; returns the per-sample weights' gradient (None without them)."""
        emb, indices = self._emb, saved.indices
        n = indices.numel()
        if n == 0:
            return None if saved.per_sample_weights is None else torch.zeros_like(saved.per_sample_weights)
        feature, positions, scale = self.element_positions(saved)
        grad_rows = grad.reshape(-1).float()[positions] * scale.unsqueeze(1)  # [n, max_d], unweighted
        dim = self._dim_of_feature[feature]
        valid = torch.arange(self._max_d, device=indices.device).unsqueeze(0) < dim.unsqueeze(1)
        col = torch.minimum(torch.arange(self._max_d, device=indices.device).unsqueeze(0), (dim - 1).unsqueeze(1))
        weights = self._flats["weights"]
        w_pos = self._feature_offsets["weights"][feature].unsqueeze(1) + indices.unsqueeze(1) * dim.unsqueeze(1) + col
        w_old = weights[w_pos].float()
        psw_grad = None
        if saved.per_sample_weights is not None:
            if saved.per_sample_weights.requires_grad:
                psw_grad = ((grad_rows * w_old) * valid).sum(1).to(saved.per_sample_weights.dtype)
            grad_rows = grad_rows * saved.per_sample_weights.float().unsqueeze(1)
        # Rows across tables: a table's rows are distinct by their weights position of column 0.
        key = w_pos[:, 0]
        order = torch.sort(key, stable=True).indices
        first = torch.ones(n, dtype=torch.bool, device=key.device)
        first[1:] = key[order][1:] != key[order][:-1]
        run = torch.cumsum(first.long(), 0) - 1  # per sorted occurrence, its row's run
        summed = torch.zeros(n, self._max_d, device=grad_rows.device).index_add_(0, run, grad_rows[order])
        g = torch.empty_like(summed)
        g[order] = summed[run]  # per occurrence, its row's summed gradient
        self._step(emb, feature, indices, dim, col, valid, w_pos, w_old, g, saved.step)
        return psw_grad

    def _step(self, emb: Any, feature: torch.Tensor, indices: torch.Tensor, dim: torch.Tensor, col: torch.Tensor,
              valid: torch.Tensor, w_pos: torch.Tensor, w: torch.Tensor, g: torch.Tensor, step: torch.Tensor) -> None:
        """One Adam step on every occurrence's row (duplicates compute and write identical values)."""
        args = emb.optimizer_args
        lr, eps, beta1, beta2, decay = emb.get_learning_rate(), args.eps, args.beta1, args.beta2, args.weight_decay
        m1, m2 = self._flats["momentum1"], self._flats["momentum2"]
        rows = indices.unsqueeze(1)
        m1_pos = self._feature_offsets["momentum1"][feature].unsqueeze(1) + rows * dim.unsqueeze(1) + col
        m = beta1 * m1[m1_pos] + (1 - beta1) * g
        if self.rowwise:
            m2_pos = self._feature_offsets["momentum2"][feature] + indices
            v_row = beta2 * m2[m2_pos] + (1 - beta2) * ((g * g) * valid).sum(1) / dim.to(g.dtype)
            v = v_row.unsqueeze(1)
        else:
            m2_pos = self._feature_offsets["momentum2"][feature].unsqueeze(1) + rows * dim.unsqueeze(1) + col
            v = beta2 * m2[m2_pos] + (1 - beta2) * g * g
        step = step.to(torch.float64)
        correction1 = (1 - torch.pow(beta1, step)).to(torch.float32)
        correction2 = (1 - torch.pow(beta2, step)).to(torch.float32)
        update = (m / correction1) / (torch.sqrt(v / correction2) + eps) + decay * w
        weights = self._flats["weights"]
        weights.index_put_((w_pos,), (w - lr * update).to(weights.dtype))
        m1.index_put_((m1_pos,), m)
        m2.index_put_((m2_pos,), v_row if self.rowwise else v)


@dataclasses.dataclass
class _Saved:
    """What one training lookup's backward needs (its step on the device)."""

    indices: torch.Tensor
    offsets: torch.Tensor
    per_sample_weights: Optional[torch.Tensor]
    step: torch.Tensor
    batch_size_per_feature_per_rank: Optional[List[List[int]]]


class _Backward(torch.autograd.Function):
    """Autograd's link: the lookup's output depends on the TBE's placeholder (and the per-sample weights)."""

    @staticmethod
    def forward(ctx: Any, placeholder: torch.Tensor, per_sample_weights: Optional[torch.Tensor],
                run: Callable[[], torch.Tensor], lookup: _AdamLookup, saved: _Saved) -> torch.Tensor:
        ctx.lookup, ctx.saved = lookup, saved
        return run()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        psw_grad = ctx.lookup.backward(grad.contiguous(), ctx.saved)
        del ctx.saved
        return None, psw_grad, None, None, None

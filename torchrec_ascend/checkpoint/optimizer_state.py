"""What a hash or KEY_VALUE kernel's fused optimizer shows in stock ``fused_optimizer.state_dict()``.

TorchRec's fused optimizer of a kernel keeps ``state``: per table parameter, its optimizer states as ShardedTensors
over the kernel's own tensors. For our kernels, ``state`` shows instead:

* a KEY_VALUE table's states sized by the table's rows, not the device cache's (windows of a
  :class:`~torchrec_ascend.checkpoint.key_value_state.TableView`);
* a hash table's ``<table>.policy_state`` (:class:`~torchrec_ascend.checkpoint.policy_state.PolicyState`);
* with fused Adam (``torchrec_ascend.kernels.fused_optimizers``), every table's ``<table>.iter``: the kernel's step
  counter itself (fbgemm's ``iter``, one per kernel, the same on every rank), which Adam's bias correction reads, so
  a load sets it in place.

TorchRec's ``state_dict()`` / ``load_state_dict()`` read ``state``, so DCP saves and loads both as stock code asks.

Example::

    install_optimizer_state(sharded_ebc)
    dmp.fused_optimizer.state_dict()["state"]["ebc.embedding_bags.user.weight"]["user.policy_state"]   # {"0": b"..."}
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor

from torchrec_ascend.adapters.tbe import TBE
from torchrec_ascend.checkpoint.key_value_state import views_of
from torchrec_ascend.checkpoint.policy_state import POLICY_STATE, PolicyState
from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.fused_optimizers import step_counter
from torchrec_ascend.kernels.key_value.kernel import KeyValueRows
from torchrec_ascend.kernels.walk import sharded_kernels

_WEIGHT = ".weight"  # TorchRec keys a table's parameter in its fused optimizer as "[<module path>.]<table>.weight"


def install_optimizer_state(module: torch.nn.Module) -> None:
    """Make the fused optimizer of every hash, KEY_VALUE or fused-Adam kernel of a sharded collection show the state
    above."""
    for kernel in sharded_kernels(module):
        optimizer = getattr(kernel, "fused_optimizer", None)
        ours = isinstance(kernel, HashRows) or step_counter(kernel) is not None
        if ours and optimizer is not None and not isinstance(optimizer, _CheckpointedState):
            optimizer.__class__ = type(f"Checkpointed{type(optimizer).__name__}",
                                       (_CheckpointedState, type(optimizer)), {})
            optimizer._checkpointed_kernel = kernel


class _CheckpointedState:
    """Mixed into a hash or KEY_VALUE kernel's fused optimizer: ``state`` as the module docstring says."""

    _checkpointed_kernel: Any
    params: Dict[str, Any]

    @property
    def state(self) -> Dict[Any, Dict[str, Any]]:
        kernel = self._checkpointed_kernel
        shards: Dict[str, List[Tuple[Any, int]]] = {}
        for t, table in enumerate(TBE(kernel).config.embedding_tables):
            shards.setdefault(table.name, []).append((kernel, t))
        counter = step_counter(kernel)
        keys = {id(param): key for key, param in self.params.items()}
        out: Dict[Any, Dict[str, Any]] = {}
        for param, states in self.__dict__["state"].items():
            key = keys.get(id(param), "")
            name = next((n for n in shards if key == n + _WEIGHT or key.endswith(f".{n}{_WEIGHT}")), None)
            # Ours first: DCP reads in this order, so the policy state is in when the last row window lands and the
            # KEY_VALUE load is applied.
            ours: Dict[str, Any] = {}
            if name is not None and counter is not None:
                ours[f"{name}.iter"] = counter
            t = shards[name][0][1] if name is not None else -1
            hash_shard = name is not None and isinstance(kernel, HashRows) and kernel.shard_info(t).hash_ids
            if name is not None and hash_shard and kernel.shard_info(t).table.local_metadata is not None:
                ours[f"{name}.{POLICY_STATE}"] = PolicyState(shards[name])
            out[param] = {**ours, **states}
            if name is not None and isinstance(kernel, KeyValueRows):  # each ShardedTensor state, sized by the table
                sharded = [n for n, value in states.items() if isinstance(value, ShardedTensor)]
                for k, state_name in enumerate(sharded):
                    out[param][state_name] = views_of(kernel).table(t).optimizer_state(k, states[state_name])
        return out

    @state.setter
    def state(self, value: Dict[Any, Dict[str, Any]]) -> None:
        self.__dict__["state"] = value

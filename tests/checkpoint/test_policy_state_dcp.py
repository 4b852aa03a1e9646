"""Hash tables' policy state through stock torch.distributed.checkpoint (one rank): a model restored by DCP alone
makes the same eviction and admission decisions as the saved one. The oracle is the saved model trained on without
stopping: its rows, the IDs it holds, where its cache holds them, and its counters, against the restored model's
after the same steps. Damaged or mismatched policy state is refused naming the table, the model unchanged. The
2-rank cases (2 -> 2 exact, 2 -> 1 resharded) are in the conformance checkpoint script."""

from __future__ import annotations

import tempfile
from typing import Any, Dict, Iterator

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torchrec
from torch.distributed.checkpoint.api import CheckpointException
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.checkpoint.key_value_state import settle_loads
from torchrec_ascend.errors import StorageError
from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.walk import sharded_kernels

pytestmark = pytest.mark.usefixtures("one_rank_group")
# A FUSED table holds a third of the IDs, a KEY_VALUE table's cache an eighth: eviction decides every step
ROWS, DIM, POOL = {"fused": 64, "key_value": 512}, 8, 200
POLICY = "embedding_bags.user.weight"


@pytest.fixture
def disk() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        yield directory


def model(kernel: str, disk: str) -> DistributedModelParallel:
    torch.manual_seed(0)
    ebc = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name="user", embedding_dim=DIM, num_embeddings=ROWS[kernel], feature_names=["uid"], init_seed=3,
        overflow="evict", eviction_policy="lfu", admission_policy="count", admission_options={"threshold": 2})])
    apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": 0.1})
    extra: Dict[str, Any] = {"cache_params": CacheParams(load_factor=0.05), "key_value_params": KeyValueParams(
        l2_cache_size=1e-6, ssd_storage_directory=disk)} if kernel == "key_value" else {}
    constraints = {"user": ParameterConstraints(sharding_types=["table_wise"], compute_kernels=[kernel], **extra)}
    sharders = get_default_hybrid_sharders()
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                    constraints=constraints).plan(ebc, sharders)
    return DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=torch.device("cpu"), plan=plan, sharders=sharders)


def batch(step: int, first_id: int = 2**41) -> KeyedJaggedTensor:
    ids = torch.randint(0, POOL, (12,), generator=torch.Generator().manual_seed(step)) * 7919 + first_id
    return KeyedJaggedTensor.from_lengths_sync(keys=["uid"], values=ids, lengths=torch.ones(12, dtype=torch.long))


def train(dmp: DistributedModelParallel, steps: range, first_id: int = 2**41) -> torch.Tensor:
    outputs = []
    for step in steps:
        out = dmp(batch(step, first_id)).values()
        out.sum().backward()
        outputs.append(out.detach())
    return torch.cat(outputs)


def decisions(dmp: DistributedModelParallel) -> Dict[str, Any]:
    """What the policies decided: the IDs held, at which pool slot, last used when, and the counters."""
    (kernel,) = [k for k in sharded_kernels(dmp) if isinstance(k, HashRows)]
    ids, slots, last_used = kernel.slot_table(0).held()
    order = torch.argsort(ids)
    return {"ids": ids[order].tolist(), "slots": slots[order].tolist(), "last_used": last_used[order].tolist(),
            "stats": kernel.slot_table(0).stats(), "rows": kernel.checkpoint.read_records(0, ids[order])[0]}


def both(dmp: DistributedModelParallel) -> Dict[str, Any]:
    return {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}


def saved_entry(dmp: DistributedModelParallel) -> bytes:
    """This rank's ``user.policy_state`` entry of ``dmp.fused_optimizer.state_dict()``."""
    return dmp.fused_optimizer.state_dict()["state"][POLICY]["user.policy_state"]["0"]


def assert_same(a: Dict[str, Any], b: Dict[str, Any]) -> None:
    assert a["stats"] == b["stats"], (a["stats"], b["stats"])
    for key in ("ids", "slots", "last_used"):
        assert a[key] == b[key], f"{key} differ"
    assert torch.equal(a["rows"], b["rows"])


@pytest.mark.parametrize("kernel", ["fused", "key_value"])
def test_dcp_alone_restores_the_same_eviction_and_admission_decisions(kernel: str, disk: str) -> None:
    saved = model(kernel, disk)
    train(saved, range(30))
    assert decisions(saved)["stats"]["evicted"] > 0, "eviction must be at work for this to prove much"
    dcp.save(both(saved), checkpoint_id=f"{disk}/ckpt")
    loaded = model(kernel, disk)
    state = both(loaded)
    dcp.load(state, checkpoint_id=f"{disk}/ckpt")
    if kernel == "fused":  # a FUSED hash table takes its IDs from load_state_dict (stock DCP usage)
        loaded.load_state_dict(state["model"])
    assert not settle_loads(loaded)
    assert_same(decisions(loaded), decisions(saved))
    assert torch.equal(train(loaded, range(30, 40)), train(saved, range(30, 40)))
    assert_same(decisions(loaded), decisions(saved))


def test_an_optimizer_loaded_after_the_model_still_restores_a_fused_tables_policies(disk: str) -> None:
    saved = model("fused", disk)
    train(saved, range(30))
    dcp.save(both(saved), checkpoint_id=f"{disk}/ckpt")
    loaded = model("fused", disk)
    state = both(loaded)
    dcp.load(state, checkpoint_id=f"{disk}/ckpt")
    loaded.fused_optimizer.load_state_dict(state["optim"])  # before the model's IDs are in: waits for them
    loaded.load_state_dict(state["model"])
    assert torch.equal(train(loaded, range(30, 40)), train(saved, range(30, 40)))
    assert_same(decisions(loaded), decisions(saved))


def test_model_only_loads_start_policies_over_with_every_row(disk: str) -> None:
    saved = model("key_value", disk)
    train(saved, range(30))
    dcp.save(both(saved), checkpoint_id=f"{disk}/ckpt")
    loaded = model("key_value", disk)
    state = {"model": loaded.state_dict()}
    dcp.load(state, checkpoint_id=f"{disk}/ckpt")
    assert not settle_loads(loaded)
    restored, reference = decisions(loaded), decisions(saved)
    assert restored["stats"] != reference["stats"], "without the optimizer's state_dict, policies start over"


def save_with_policy_state(dmp: DistributedModelParallel, entry: bytes, path: str) -> None:
    """A DCP checkpoint of ``dmp`` whose ``user.policy_state`` entry is ``entry``."""
    state = both(dmp)
    state["optim"]["state"][POLICY]["user.policy_state"]["0"] = entry
    dcp.save(state, checkpoint_id=path)


def test_damaged_policy_state_is_refused_naming_the_table_and_the_model_is_unchanged(disk: str) -> None:
    saved = model("key_value", disk)
    train(saved, range(30))
    save_with_policy_state(saved, saved_entry(saved)[:100], f"{disk}/ckpt")  # a truncated entry
    loaded = model("key_value", disk)
    train(loaded, range(3))
    before = decisions(loaded)
    with pytest.raises(CheckpointException, match=r"hash table 'user': its policy_state entry cannot be read"):
        dcp.load(both(loaded), checkpoint_id=f"{disk}/ckpt")
    assert_same(decisions(loaded), before)


def test_policy_state_of_another_save_is_refused(disk: str) -> None:
    other = model("key_value", disk)
    train(other, range(30), first_id=2**42)  # other IDs
    saved = model("key_value", disk)
    train(saved, range(30))
    save_with_policy_state(saved, saved_entry(other), f"{disk}/ckpt")
    loaded = model("key_value", disk)
    before = decisions(loaded)
    with pytest.raises(CheckpointException, match=r"'user'.*different saves"):
        dcp.load(both(loaded), checkpoint_id=f"{disk}/ckpt")
    assert_same(decisions(loaded), before)


def test_policy_state_is_bytes_numpy_reads_without_pickle(disk: str) -> None:
    dmp = model("key_value", disk)
    train(dmp, range(5))
    value = saved_entry(dmp)
    assert isinstance(value, bytes) and value[:2] == b"PK"  # a .npz archive (read with allow_pickle=False)
    optim = dmp.fused_optimizer.state_dict()
    optim["state"][POLICY]["user.policy_state"]["0"] = [1, 2]
    with pytest.raises(StorageError, match="'user'.*not bytes"):
        dmp.fused_optimizer.load_state_dict(optim)

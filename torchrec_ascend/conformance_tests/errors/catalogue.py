"""The catalogue of bad inputs users can hit, one table: what the user does, the exception and what its message says.

Each :class:`BadInput` row carries a ``trigger`` that does the bad thing for real (in this process, on a one-rank
process group where a sharded model is needed; device choices in a fresh interpreter, since a backend is chosen
once per process). ``tests/errors/test_catalogue.py`` runs every row in CI; ``python -m
torchrec_ascend.conformance_tests.errors.catalogue`` runs them too and prints the README's table with the messages
users see. The sharded rows reuse the conformance suite's ``errors/bad_inputs.py`` cases.

Example::

    for row in CATALOGUE:
        print(row.area, row.kind, row.raises.__name__, row.fragment)
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Type
from unittest import mock

import torch
from torchrec.distributed.planner.types import PlannerError

from torchrec_ascend.errors import BackendError, CapacityError, ConfigError, PluginError, StorageError


@dataclasses.dataclass(frozen=True)
class BadInput:
    """One bad input.

    Attributes:
        area: what it is about (configs, constraints, IDs, batches, policies, plugins, devices, versions,
            checkpoints, disks, data).
        kind: a short name (the test id).
        input: what the user does, as the README says it.
        raises: the exception type (a subclass passes too).
        fragment: text the message must contain.
        trigger: does it, in a scratch folder; must raise.
        group: needs a process group (sharded models; the tests give it a one-rank gloo group).
    """

    area: str
    kind: str
    input: str
    raises: Type[BaseException]
    fragment: str
    trigger: Callable[[Path], Any]
    group: bool = False


# -- triggers ------------------------------------------------------------------------------------------------------


def _config(**options: Any) -> Any:
    from torchrec_ascend import HashEmbeddingBagConfig

    base: Dict[str, Any] = {"name": "user", "embedding_dim": 8, "num_embeddings": 64, "feature_names": ["f_user"]}
    return HashEmbeddingBagConfig(**{**base, **options})


def _bad_inputs_case(**case: Any) -> Callable[[Path], Any]:
    """A case of the conformance suite's ``errors/bad_inputs.py``, run on the default (one-rank) process group."""

    def trigger(_: Path) -> None:
        import torch.distributed as dist

        from torchrec_ascend.conformance_tests.errors import bad_inputs

        bad_inputs.run_case(case, dist.group.WORLD)

    return trigger


def _sharded(constraints: Dict[str, Dict[str, Any]], tables: Optional[List[Any]] = None,
             fused_params: Optional[Dict[str, Any]] = None) -> Callable[[Path], Any]:
    """Shard an EmbeddingBagCollection (default: hash tables ``user`` and ``item``) with these constraints (and the
    sharders' ``fused_params``)."""

    def trigger(scratch: Path) -> None:
        _shard(constraints, tables, fused_params)

    return trigger


def _shard(constraints: Dict[str, Dict[str, Any]], tables: Optional[List[Any]] = None,
           fused_params: Optional[Dict[str, Any]] = None) -> Any:
    """The DistributedModelParallel of :func:`_sharded`, on the default (one-rank) group."""
    import torch.distributed as dist
    import torchrec
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv

    from torchrec_ascend import get_default_hybrid_sharders

    module = torchrec.EmbeddingBagCollection(tables=tables or [
        _config(name=name, feature_names=[f"f_{name}"]) for name in ("user", "item")])
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=1, compute_device="cpu"),
        constraints={name: ParameterConstraints(**c) for name, c in constraints.items()})
    sharders = get_default_hybrid_sharders(fused_params=fused_params)
    return DistributedModelParallel(module, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=torch.device("cpu"), plan=planner.plan(module, sharders),
                                    sharders=sharders)


def _adam(**options: Any) -> Callable[[Path], Any]:
    """Shard hash table ``user`` FUSED with fused ADAM and these ``fused_params``."""

    def trigger(scratch: Path) -> None:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        fused_params = {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.01, **options}
        _sharded({"user": {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]}}, tables=[_config()],
                 fused_params=fused_params)(scratch)

    return trigger


def _policy(kind: str, name: str, **options: Any) -> Callable[[Path], Any]:
    def trigger(_: Path) -> None:
        from torchrec_ascend.policies import registry

        if kind == "eviction":
            registry.create_eviction_policy(name, capacity=8, **options)
        else:
            registry.create_admission_policy(name, **options)

    return trigger


def _unknown_device(_: Path) -> None:
    """Select a misspelled backend in this process (the active backend is re-selected afterwards)."""
    from torchrec_ascend import backends

    with mock.patch.dict(os.environ, {backends.DEVICE_ENV: "cpux"}):
        backends.reset_for_tests()
        try:
            backends.activate()
        finally:
            backends.reset_for_tests()
    backends.activate()


def _npu_without_torch_npu(_: Path) -> None:
    """Select the npu backend in a fresh interpreter (no torch_npu there); re-raise its BackendError here."""
    from torchrec_ascend import backends

    proc = subprocess.run([sys.executable, "-c", "from torchrec_ascend import backends; backends.activate()"],
                          env={**os.environ, backends.DEVICE_ENV: "npu"}, capture_output=True, text=True, timeout=300)
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode != 0 and last.startswith("torchrec_ascend.errors.BackendError: "):
        raise BackendError(last.split(": ", 1)[1])
    raise RuntimeError(f"exit {proc.returncode}: {last}")


class _RaisingPlugin:
    from torchrec_ascend.hookspecs import hookimpl

    @staticmethod
    @hookimpl
    def torchrec_ascend_policies() -> List[Any]:
        raise KeyError("policy table not built")


def _raising_plugin(_: Path) -> None:
    from torchrec_ascend.plugin_manager import PluginManager

    manager = PluginManager()
    manager.register(_RaisingPlugin, "my_policies")
    manager.collect("torchrec_ascend_policies")


def _mixed_row_wise(scratch: Path) -> None:
    import torchrec

    plain = torchrec.EmbeddingBagConfig(name="plain", embedding_dim=8, num_embeddings=64, feature_names=["f_plain"])
    _sharded({name: {"sharding_types": ["row_wise"], "compute_kernels": ["fused"]} for name in ("user", "plain")},
             tables=[_config(), plain])(scratch)


def _broken_policy(_: Path) -> None:
    """A plugin's eviction policy answering with one victim twice, as the cache calls it (through the checks)."""
    from torchrec_ascend.plugin_manager import PluginInfo
    from torchrec_ascend.policies.builtin.recency import LRU
    from torchrec_ascend.policies.checked import CheckedEvictionPolicy

    class RepeatsVictims(LRU):
        def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
            return super().select_victims(num, evictable, step)[:1].repeat(num)

    policy = CheckedEvictionPolicy(RepeatsVictims(8), "repeats_victims",
                                   PluginInfo("my_policies", "my-policies", "0.1.0", "my_policies"))
    slots = torch.arange(4)
    policy.on_insert(slots, slots + 100, 0)
    policy.select_victims(2, torch.ones(8, dtype=torch.bool), 1)


def _pipeline(**options: Any) -> Callable[[Path], Any]:
    def trigger(_: Path) -> None:
        from torchrec_ascend.pipeline import sizing

        if "pipe_n_batch" in options:
            sizing.validate_depth(options["pipe_n_batch"])
        else:
            sizing.host_threads(options["host_threads"])

    return trigger


def _old_torchrec(_: Path) -> None:
    from torchrec_ascend import HybridTrainPipelineSparseDist
    from torchrec_ascend.adapters import requirements

    with mock.patch.object(requirements, "installed_version", lambda name: "1.6.0"):
        HybridTrainPipelineSparseDist(torch.nn.Linear(1, 1), torch.optim.SGD([torch.zeros(1)], lr=0.1),
                                      torch.device("cpu"))


def _saved_chain(scratch: Path) -> Path:
    """A small two-save checkpoint (the fuzz tests' layout) written without a model; returns its path."""
    from torchrec_ascend.checkpoint.files import FORMAT_VERSION, ArrayFileWriter, write_json
    from torchrec_ascend.checkpoint.layout import ShardLayout
    from torchrec_ascend.checkpoint.shard_files import write_shard
    from torchrec_ascend.checkpoint.versions import FORMAT, METADATA, save_directory
    from torchrec_ascend.kernels.fused import ShardRows

    root = scratch / "ckpt"
    layout = ShardLayout(table="user", hash_ids=True, dim=4, col0=0, cols=4, bucket=0, buckets=1, row_offset=0,
                         rows=16, capacity=15, key_value=False, optimizer="sgd", states=(), eviction="",
                         admission="")
    directory = Path(save_directory(str(root), 1))
    directory.mkdir(parents=True)
    ids = torch.arange(3)
    with ArrayFileWriter(str(directory / "rank-00000-of-00001.data")) as writer:
        shard = write_shard(writer, layout, [ShardRows(ids, ids, ids, torch.ones(3, 4))],
                            lambda: torch.empty(0, dtype=torch.int64), {"step": 1})
        size = writer.commit()
    write_json(str(directory / METADATA), {
        "format": FORMAT, "format_version": FORMAT_VERSION, "id": "x", "version": 1, "kind": "full", "chain": [1],
        "world_size": 1, "created": 0.0, "files": {"rank-00000-of-00001.data": size}, "shards": [shard]})
    return root


def _checkpoint(change: Callable[[Path, Dict[str, Any]], None]) -> Callable[[Path], Any]:
    """Write a checkpoint, damage it with ``change(save folder, metadata)``, and read it as a load does."""

    def trigger(scratch: Path) -> None:
        from torchrec_ascend.checkpoint.layout import ShardLayout
        from torchrec_ascend.checkpoint.restore import _entries_of
        from torchrec_ascend.checkpoint.shard_files import read_chain_records
        from torchrec_ascend.checkpoint.versions import METADATA, resolve_chain, save_directory

        root = _saved_chain(scratch)
        directory = Path(save_directory(str(root), 1))
        metadata = json.loads((directory / METADATA).read_text())
        change(directory, metadata)
        (directory / METADATA).write_text(json.dumps(metadata))
        chain = resolve_chain(str(root))
        for entry in chain[-1][1]["shards"]:
            read_chain_records(_entries_of(chain, ShardLayout.from_json(entry["layout"])))

    return trigger


def _set(path: List[Any], value: Any) -> Callable[[Path, Dict[str, Any]], None]:
    def change(_: Path, metadata: Dict[str, Any]) -> None:
        node = metadata
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


def _point_away(directory: Path, metadata: Dict[str, Any]) -> None:
    name = "../../elsewhere/rank-00000-of-00001.data"
    metadata["files"][name] = metadata["files"].pop(metadata["shards"][0]["file"])
    metadata["shards"][0]["file"] = name


def _grow(directory: Path, metadata: Dict[str, Any]) -> None:
    removed = metadata["shards"][0]["arrays"]["removed"]
    removed["shape"], removed["nbytes"] = [2**40], 2**43  # 8 TiB, consistent with the dtype


def _flip_rows(directory: Path, metadata: Dict[str, Any]) -> None:
    rows = metadata["shards"][0]["blocks"][0]["rows"]
    with open(directory / "rank-00000-of-00001.data", "r+b") as f:
        f.seek(rows["offset"] + 5)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))


def _truncate(directory: Path, metadata: Dict[str, Any]) -> None:
    os.truncate(directory / "rank-00000-of-00001.data", 100)


def _empty_checkpoint(scratch: Path) -> None:
    from torchrec_ascend.checkpoint.versions import resolve_chain

    resolve_chain(str(scratch / "nothing"))


def _wrong_saver_rank(_: Path) -> None:
    from torchrec_ascend.checkpoint import Saver

    Saver(rank=3).save(torch.nn.Linear(1, 1), "/nonexistent")


def _key_value(scratch: Path, load_factor: float = 0.5, disk: Optional[Path] = None) -> None:
    """Shard hash table ``user`` table-wise with the KEY_VALUE kernel."""
    from torchrec.distributed.types import CacheParams, KeyValueParams

    disk = disk or scratch / "disk"
    _sharded({"user": {"sharding_types": ["table_wise"], "compute_kernels": ["key_value"],
                       "cache_params": CacheParams(load_factor=load_factor),
                       "key_value_params": KeyValueParams(l2_cache_size=1e-6, ssd_storage_directory=str(disk))}},
             tables=[_config()])(scratch)


def _caches_past_hbm(scratch: Path) -> None:
    """Plan (nothing is sharded) hash table ``user``, 65,536 x 64, KEY_VALUE with a cache of 1/8 of its rows (2.1 MB
    of weights) on one device of 1 MiB HBM. The topology is the npu's as the stock planner sees it (the profile's
    planner alias, ``cuda``): a cpu topology has no HBM (the cache counts as host memory there)."""
    import torchrec
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import CacheParams, KeyValueParams

    from torchrec_ascend import get_default_hybrid_sharders
    from torchrec_ascend.backends.npu import NPU

    module = torchrec.EmbeddingBagCollection(tables=[_config(num_embeddings=65536, embedding_dim=64)],
                                             device=torch.device("meta"))
    constraints = {"user": ParameterConstraints(
        sharding_types=["table_wise"], compute_kernels=["key_value"], cache_params=CacheParams(load_factor=0.125),
        key_value_params=KeyValueParams(l2_cache_size=1e-6, ssd_storage_directory=str(scratch / "disk")))}
    topology = Topology(world_size=1, compute_device=NPU.planner.alias, hbm_cap=1 << 20)
    EmbeddingShardingPlanner(topology=topology, constraints=constraints).plan(module, get_default_hybrid_sharders())


def _flipped_segment(scratch: Path) -> None:
    """Spill rows of a KEY_VALUE table to its disk tier, flip bytes of the first record, read the rows back."""
    from torchrec.distributed.types import CacheParams, KeyValueParams
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    disk = scratch / "disk"
    model = _shard({"user": {"sharding_types": ["table_wise"], "compute_kernels": ["key_value"],
                             "cache_params": CacheParams(load_factor=0.25),
                             "key_value_params": KeyValueParams(l2_cache_size=1e-6, ssd_storage_directory=str(disk))}},
                   tables=[_config()])

    def train(ids: List[int]) -> None:
        batch = KeyedJaggedTensor.from_lengths_sync(keys=["f_user"], values=torch.tensor(ids),
                                                    lengths=torch.tensor([len(ids)]))
        model(batch).values().sum().backward()

    for start in range(0, 60, 10):
        train(list(range(start, start + 10)))
    segment = sorted(disk.rglob("*.rows"))[0]
    with open(segment, "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff\xff\xff")
    for start in range(0, 60, 10):
        train(list(range(start, start + 10)))


def _disk_is_a_file(scratch: Path) -> None:
    blocker = scratch / "not_a_folder"
    blocker.write_text("a file where the disk tier's folder should be")
    _key_value(scratch, disk=blocker)


def _wheel(scratch: Path, member: bytes) -> None:
    from torchrec_ascend.datasets import movielens

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(movielens.ML100K_INTER, member)
    (scratch / movielens.RECBOLE_WHEEL).write_bytes(buffer.getvalue())
    movielens.load_movielens_100k(scratch)


def _truncated_wheel(scratch: Path) -> None:
    from torchrec_ascend.datasets import movielens

    (scratch / movielens.RECBOLE_WHEEL).write_bytes(b"PK\x03\x04 half a download")
    movielens.load_movielens_100k(scratch)


HEADER = b"user_id:token\titem_id:token\trating:float\ttimestamp:float\n"

# -- the catalogue -------------------------------------------------------------------------------------------------

CATALOGUE: List[BadInput] = [
    BadInput("configs", "capacity_below_1", "`HashEmbeddingBagConfig(num_embeddings=0)`", ConfigError,
             "num_embeddings is the row capacity and must be an integer >= 1", lambda _: _config(num_embeddings=0)),
    BadInput("configs", "width_below_1", "`HashEmbeddingBagConfig(embedding_dim=0)`", ConfigError,
             "embedding_dim is the width of a row and must be an integer >= 1", lambda _: _config(embedding_dim=0)),
    BadInput("configs", "overflow_in_eviction_options", '`overflow="evict", eviction_options={"overflow": "error"}`',
             ConfigError, "eviction_options holds overflow='error': table options the eviction policy never reads",
             lambda _: _config(overflow="evict", eviction_options={"overflow": "error"})),
    BadInput("configs", "eviction_settings_never_used",
             '`eviction_policy="lfu", eviction_options={"history": 5}` with `overflow="error"` (FUSED)', ConfigError,
             "would be ignored: with overflow='error' this table never evicts",
             lambda s: _sharded({"user": {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]}},
                                tables=[_config(eviction_policy="lfu", eviction_options={"history": 5})])(s),
             group=True),
    BadInput("configs", "stock_field_ignored", "`HashEmbeddingBagConfig(init_fn=...)` (or `total_num_buckets`, "
             "`use_virtual_table`, ...)", ConfigError, "would be ignored: a hash table maps raw IDs itself",
             lambda _: _config(init_fn=torch.nn.init.zeros_)),
    BadInput("configs", "overflow_misspelled", '`overflow="evcit"`', ConfigError, "overflow must be one of",
             lambda _: _config(overflow="evcit")),
    BadInput("configs", "no_eviction_policy", '`eviction_policy=""`', ConfigError,
             "eviction_policy must name a policy", lambda _: _config(eviction_policy="")),
    BadInput("configs", "cadence_option", '`eviction_cadence={"intervall": 10}`', ConfigError,
             "eviction_cadence does not take ['intervall']; it takes interval, min_residency, headroom",
             lambda _: _config(overflow="evict", eviction_cadence={"intervall": 10})),
    BadInput("configs", "admission_options_alone", '`admission_options={"threshold": 2}` without `admission_policy`',
             ConfigError, "are given without an admission_policy",
             lambda _: _config(admission_options={"threshold": 2})),
    BadInput("configs", "init_range", "`weight_init_min=1.0, weight_init_max=0.0`", ConfigError,
             "weight_init_min (1.0) must be below weight_init_max (0.0)",
             lambda _: _config(weight_init_min=1.0, weight_init_max=0.0)),
    BadInput("configs", "adam_beta_out_of_range", '`fused_params={"optimizer": EmbOptimType.ADAM, "beta1": 1.0}`',
             ConfigError, "tables [user] (ADAM): beta1=1.0 must be in [0, 1)", _adam(beta1=1.0), group=True),
    BadInput("configs", "adam_gradient_clipping", '`fused_params={"optimizer": EmbOptimType.ADAM, '
             '"gradient_clipping": True}`', ConfigError, "gradient_clipping and use_rowwise_bias_correction are not "
             "supported", _adam(gradient_clipping=True), group=True),
    BadInput("configs", "pipeline_depth", "`HybridTrainPipelineSparseDist(..., pipe_n_batch=0)`", ConfigError,
             "pipe_n_batch=0 is invalid", _pipeline(pipe_n_batch=0)),
    BadInput("configs", "host_threads", "`HybridTrainPipelineSparseDist(..., host_threads=0)`", ConfigError,
             "host_threads=0 is invalid", _pipeline(host_threads=0)),
    BadInput("constraints", "hash_table_row_wise_sharding",
             '`ParameterConstraints(sharding_types=["table_row_wise"])` for a hash table (stock planner)',
             RuntimeError, "No available sharding type and compute kernel combination after applying user provided "
             "constraints for user", _sharded({"user": {"sharding_types": ["table_row_wise"]}}), group=True),
    BadInput("constraints", "row_wise_hash_and_plain", "row-wise hash and row-wise plain tables in one module",
             ConfigError, "are in one module", _mixed_row_wise, group=True),
    BadInput("constraints", "load_factor", "KEY_VALUE table with `CacheParams(load_factor=1.5)`", ConfigError,
             "must be in (0, 1]", lambda s: _key_value(s, load_factor=1.5), group=True),
    BadInput("constraints", "caches_past_hbm", "a KEY_VALUE table whose device cache does not fit the topology's "
             "`hbm_cap` (`planner.plan`)", PlannerError, "of table user", _caches_past_hbm),
    BadInput("IDs", "negative_id", "a negative ID in a batch of an unsharded hash table", ValueError,
             "IDs must be non-negative int64", _bad_inputs_case(kind="negative_id", sharding_type="unsharded"),
             group=True),
    BadInput("IDs", "negative_id_row_wise", "a negative ID in a batch of a row-wise sharded hash table (input dist)",
             ValueError, "non-negative", _bad_inputs_case(kind="negative_id", sharding_type="row_wise"), group=True),
    BadInput("IDs", "negative_id_table_wise", "a negative ID, table-wise sharded", ValueError, "non-negative",
             _bad_inputs_case(kind="negative_id", sharding_type="table_wise"), group=True),
    BadInput("IDs", "full_table", 'more new IDs than `num_embeddings` with `overflow="error"`', CapacityError,
             "overflow='evict'", _bad_inputs_case(kind="full_table", sharding_type="unsharded"), group=True),
    BadInput("IDs", "full_table_sharded", "the same, table-wise sharded", CapacityError, "overflow='evict'",
             _bad_inputs_case(kind="full_table", sharding_type="table_wise"), group=True),
    BadInput("batches", "cache_too_small", "a KEY_VALUE batch with more distinct rows than the device cache holds",
             CapacityError, "load_factor",
             _bad_inputs_case(kind="small_cache", sharding_type="table_wise", cache_rows=4), group=True),
    BadInput("policies", "unknown_policy", '`eviction_policy="lruu"`', ConfigError, "did you mean 'lru'",
             _bad_inputs_case(kind="unknown_eviction_policy", sharding_type="unsharded"), group=True),
    BadInput("policies", "unknown_option", '`eviction_policy="lfu", eviction_options={"histroy": 5}`',
             ConfigError, "did you mean 'history'", _policy("eviction", "lfu", histroy=5)),
    BadInput("policies", "missing_option", '`eviction_policy="ttl"` without `ttl_steps` / `ttl_seconds`',
             ConfigError, "give exactly one of the options", _policy("eviction", "ttl")),
    BadInput("policies", "repeated_component", '`eviction_policy="lru+lru"`', ConfigError, "repeats ['lru']",
             _policy("eviction", "lru+lru")),
    BadInput("policies", "admission_composite", '`admission_policy="count+showclick"`', ConfigError,
             "admission policies do not compose", _policy("admission", "count+showclick")),
    BadInput("policies", "wrong_kind", '`eviction_policy="count"` (an admission policy)', ConfigError,
             "is an admission policy", _policy("eviction", "count")),
    BadInput("plugins", "hook_raises", "a policy plugin whose hook raises", PluginError,
             "plugin 'my_policies' ((registered in-process)) raised in hook torchrec_ascend_policies: KeyError",
             _raising_plugin),
    BadInput("plugins", "malformed_victims", "a policy plugin answering `select_victims` with one slot twice",
             PluginError, "from plugin 'my_policies' (my-policies 0.1.0) select_victims(num=2)", _broken_policy),
    BadInput("devices", "unknown_backend", "`TORCHREC_ASCEND_DEVICE=cpux`", BackendError, "Did you mean 'cpu'?",
             _unknown_device),
    BadInput("devices", "npu_without_torch_npu", "`TORCHREC_ASCEND_DEVICE=npu` without torch_npu installed",
             BackendError, "importing its stack failed", _npu_without_torch_npu),
    BadInput("versions", "unsupported_torchrec", "HybridTrainPipelineSparseDist on an unsupported torchrec",
             ConfigError, "torchrec 1.6.0 is outside the supported range", _old_torchrec),
    BadInput("versions", "newer_checkpoint", "loading a checkpoint of a newer format version", StorageError,
             "upgrade torchrec-ascend", _checkpoint(_set(["format_version"], 99))),
    BadInput("checkpoints", "path_escape", "a checkpoint whose metadata names `../elsewhere/...` or `/abs/path`",
             StorageError, "which is not a plain file name of the folder",
             _checkpoint(_point_away)),
    BadInput("checkpoints", "huge_array", "a metadata entry claiming more bytes than its data file", StorageError,
             "lie beyond its data file's", _checkpoint(_grow)),
    BadInput("checkpoints", "wrong_type", "a metadata field of the wrong type (`\"chain\": \"1\"`)", StorageError,
             "the field 'chain' is a str, not a list", _checkpoint(_set(["chain"], "1"))),
    BadInput("checkpoints", "flipped_byte", "a data file with a flipped byte", StorageError,
             "the checksum of rows of table 'user' does not match", _checkpoint(_flip_rows)),
    BadInput("checkpoints", "truncated", "a truncated data file", StorageError, "but its save recorded",
             _checkpoint(_truncate)),
    BadInput("checkpoints", "no_save", "`Saver().load(model, path)` on a path without a complete save",
             StorageError, "holds no complete save", _empty_checkpoint),
    BadInput("checkpoints", "saver_rank", "`Saver(rank=3)` on rank 0", ConfigError, "Saver(rank=3) runs on rank 0",
             _wrong_saver_rank),
    BadInput("disks", "flipped_segment_byte", "a KEY_VALUE disk tier's segment file with flipped bytes",
             StorageError, "segment-000000.rows", _flipped_segment, group=True),
    BadInput("disks", "disk_folder_is_a_file", "`KeyValueParams(ssd_storage_directory=...)` naming a file",
             StorageError, "not_a_folder", _disk_is_a_file, group=True),
    BadInput("data", "damaged_wheel", "a truncated or damaged MovieLens wheel in the data cache", StorageError,
             "Delete the file so it is downloaded again", _truncated_wheel),
    BadInput("data", "bad_interaction_line", "an interaction file with a malformed value", StorageError,
             "line 2, column 'rating': 'five' is not a number", lambda s: _wheel(s, HEADER + b"1\t2\tfive\t4\n")),
]


def message_of(row: BadInput, scratch: Path) -> str:
    """Run ``row``'s trigger; the message of what it raised (AssertionError if it raised nothing or another type)."""
    try:
        row.trigger(scratch)
    except row.raises as error:
        return str(error)
    raise AssertionError(f"{row.kind}: {row.input} raised no {row.raises.__name__}")


def readme_table(messages: Dict[str, str], width: int = 150) -> str:
    """The README's table: area, what the user does, the exception and the start of its message."""
    lines = ["| area | bad input | what the user sees |", "|---|---|---|"]
    for row in CATALOGUE:
        text = " ".join(messages[row.kind].split()).replace("|", "\\|")
        text = text if len(text) <= width else text[: width - 3] + "..."
        lines.append(f"| {row.area} | {row.input} | `{row.raises.__name__}`: {text} |")
    return "\n".join(lines)


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """A gloo group of this process alone as the default group, for the rows that shard a model (none is made when
    the process has a default group already: the suite's).

    Example::

        with one_rank_group():
            message_of(row, scratch)
    """
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), 1), rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def main() -> None:
    """Run every row (on a one-rank gloo group) and print the README table."""
    with tempfile.TemporaryDirectory() as tmp, one_rank_group():
        messages = {}
        for n, row in enumerate(CATALOGUE):
            scratch = Path(tmp) / str(n)
            scratch.mkdir()
            messages[row.kind] = message_of(row, scratch).replace(str(scratch), "DIR")
    print(readme_table(messages))


if __name__ == "__main__":
    main()

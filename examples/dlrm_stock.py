"""A stock TorchRec DLRM training script, unchanged by torchrec-ascend: it never imports the plugin.

This is what "plugin backend" means: the same code that trains on CUDA with stock TorchRec runs on CPU and Ascend
NPU once torchrec-ascend is installed (the plugin loads itself when torch is imported). One table asks for
``row_wise`` sharding, which stock TorchRec refuses on CPU; with the plugin installed it is planned and trained.

Run with two ranks on CPU (gloo)::

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE torchrun --standalone --nproc-per-node 2 examples/dlrm_stock.py

Data: ``torchrec.datasets.random.RandomRecDataset`` (random IDs and labels, so the loss stays near ln 2; the point
is the mechanics: planning, sharding, input all-to-all, fused backward and optimizer).

``--reference`` also trains the unsharded model (same initial weights, same optimizers) on the global batch, every
rank's samples, and prints the largest difference between the two models' losses (the mean over ranks of the
sharded model's loss is the unsharded model's loss on the global batch). ``--user-sharding table_wise`` puts every
table on one rank, a plan stock TorchRec supports on CPU.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
from torchrec.datasets.random import RandomRecDataset
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import KernelConfig, ParameterConstraints, TopologyFactory, TrainerConfig
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

# (table, rows, sharding): one row_wise table (needs a backend that supports it on this device), two table_wise.
TABLES = [("user", 200_000, "row_wise"), ("item", 50_000, "table_wise"), ("category", 1_000, "table_wise")]
DIM = 16
NUM_DENSE = 13


def main() -> None:
    parser = argparse.ArgumentParser(description="Stock TorchRec DLRM on random data.")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=256, help="per rank")
    parser.add_argument("--reference", action="store_true", help="compare with the unsharded model")
    parser.add_argument("--user-sharding", default="row_wise", help="sharding type of the user table")
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)

    tables = [
        EmbeddingBagConfig(name=f"t_{name}", embedding_dim=DIM, num_embeddings=rows, feature_names=[f"f_{name}"])
        for name, rows, _ in TABLES
    ]
    model = DLRMTrain(
        DLRM(
            embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
            dense_in_features=NUM_DENSE,
            dense_arch_layer_sizes=[64, DIM],
            over_arch_layer_sizes=[64, 1],
            dense_device=device,
        )
    )
    reference = unsharded_copy(model, tables) if args.reference else None
    apply_optimizer_in_backward(
        RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": 0.05}
    )  # fused into the embedding kernels' backward

    shardings = {name: args.user_sharding if name == "user" else sharding for name, _, sharding in TABLES}
    constraints = {f"t_{name}": ParameterConstraints(sharding_types=[shardings[name]]) for name, _, _ in TABLES}
    sharders = get_default_sharders()
    topology = TopologyFactory.create_topology(
        TrainerConfig(world_size=world), kernel_config=KernelConfig(compute_device=device.type)
    )
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    if rank == 0:
        for path, shardings in plan.plan.items():
            for table, sharding in shardings.items():
                print(f"{path}.{table}: {sharding.sharding_type} on ranks {sharding.ranks}, {sharding.compute_kernel}")

    dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=0.05),
    )
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense])
    pipeline = TrainPipelineSparseDist(dmp, optimizer, device)

    if reference is not None:
        copy_embeddings(reference, dmp)
    batches = iter(random_batches(rank, args))
    losses = []
    while True:
        try:
            loss, _, _ = pipeline.progress(batches)
        except StopIteration:
            break
        losses.append(float(loss))
        if rank == 0 and len(losses) % 10 == 0:
            print(f"step {len(losses)}: loss {sum(losses[-10:]) / 10:.4f}", flush=True)
    if rank == 0:
        print(f"trained {len(losses)} steps on {world} rank(s), {device.type}")
    if reference is not None:
        expected = train_unsharded(reference, world, args)
        mean_losses = torch.tensor(losses)
        dist.all_reduce(mean_losses)
        mean_losses /= world
        if rank == 0:
            diff = (mean_losses - torch.tensor(expected)).abs().max().item()
            print(f"unsharded reference: largest loss difference {diff:.3g} over {len(expected)} steps")
    dist.barrier()  # no rank tears down its connections while another still talks to it
    dist.destroy_process_group()
    # gloo's threads can outlive destroy_process_group and abort interpreter shutdown ("terminate called without an
    # active exception", seen with torch 2.14) after the work is done: end without finalizers.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def random_batches(rank: int, args: argparse.Namespace) -> Any:
    return RandomRecDataset(
        keys=[f"f_{name}" for name, _, _ in TABLES],
        batch_size=args.batch_size,
        hash_sizes=[rows for _, rows, _ in TABLES],
        ids_per_feature=4,
        num_dense=NUM_DENSE,
        manual_seed=rank,
        num_batches=args.steps,
        num_generated_batches=args.steps,  # no repeats: random labels cannot be memorised
    )


def unsharded_copy(model: torch.nn.Module, tables: List[EmbeddingBagConfig]) -> torch.nn.Module:
    """The same model with its tables on the CPU (the sharded one is built on the meta device)."""
    reference = copy.deepcopy(model)
    torch.manual_seed(1)
    reference.model.sparse_arch.embedding_bag_collection = EmbeddingBagCollection(tables=tables)
    apply_optimizer_in_backward(RowWiseAdagrad, reference.model.sparse_arch.parameters(), {"lr": 0.05})
    return reference


def copy_embeddings(reference: torch.nn.Module, dmp: torch.nn.Module) -> None:
    """Write the reference's table rows into the sharded model's shards (DMP initialises them itself)."""
    weights: Dict[str, torch.Tensor] = {
        name: value for name, value in reference.state_dict().items() if "embedding_bags" in name
    }
    with torch.no_grad():
        for name, value in dmp.state_dict().items():
            name = name[len("module."):] if name.startswith("module.") else name
            if name in weights and hasattr(value, "local_shards"):
                for shard in value.local_shards():
                    (r0, c0), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(weights[name][r0:r0 + rows, c0:c0 + cols])


def train_unsharded(reference: torch.nn.Module, world: int, args: argparse.Namespace) -> List[float]:
    """Train the unsharded model on every rank's batches at once; its loss at each step."""
    dense = torch.optim.Adagrad(dict(in_backward_optimizer_filter(reference.named_parameters())).values(), lr=0.05)
    losses = []
    for parts in zip(*[random_batches(r, args) for r in range(world)]):
        batch = concat_batches(list(parts))
        dense.zero_grad()
        loss, _ = reference(batch)
        loss.backward()
        dense.step()
        losses.append(float(loss.detach()))
    return losses


def concat_batches(parts: List[Any]) -> Any:
    """One batch holding every part's samples, in rank order."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys = parts[0].sparse_features.keys()
    per_key = [p.sparse_features.to_dict() for p in parts]
    return Batch(
        dense_features=torch.cat([p.dense_features for p in parts]),
        sparse_features=KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.cat([d[k].values() for k in keys for d in per_key]),
            lengths=torch.cat([d[k].lengths() for k in keys for d in per_key]),
        ),
        labels=torch.cat([p.labels for p in parts]),
    )


if __name__ == "__main__":
    main()

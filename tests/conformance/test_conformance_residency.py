"""A case that trained off the device under test fails, naming where each part lived.

Oracle: the device types of tensors built here by hand (CPU tensors, and ``meta`` tensors standing in for another
device: they need no accelerator), found through every container a script reports (modules, optimizers, TorchRec
jagged and keyed tensors, dicts and lists).
"""

from __future__ import annotations

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.conformance_tests.harness import check_residency, check_transfers
from torchrec_ascend.conformance_tests.plugin.runner import devices_of, merge, residency


def test_devices_of_walks_what_scripts_report() -> None:
    layer = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adagrad(layer.parameters())
    layer(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=torch.tensor([1, 2], device="meta"),
                                              lengths=torch.tensor([2], device="meta"))
    assert devices_of(layer) == devices_of(optimizer) == {"cpu"}
    assert devices_of(kjt) == {"meta"}
    assert devices_of({"a": [torch.zeros(1), (kjt,)], "b": None}) == {"cpu", "meta"}
    assert devices_of(torch.optim.SGD(layer.parameters(), lr=0.1)) == set()  # stateless: nothing to report
    assert residency(parameters=layer, outputs=[kjt]) == {"parameters": ["cpu"], "outputs": ["meta"]}


def test_a_zero_element_placeholder_lives_nowhere() -> None:
    """Stock TorchRec gives a rank ``torch.empty(0)`` host parameters for the tables it does not hold: they hold no
    data, so they cannot show a device run trained on the host; a host tensor with data still does."""
    holder = torch.nn.Module()
    holder.held = torch.nn.Parameter(torch.zeros(2, 2, device="meta"))
    holder.not_held = torch.nn.Parameter(torch.empty(0))
    assert devices_of(holder) == {"meta"}
    holder.stray = torch.nn.Parameter(torch.zeros(1))
    assert devices_of(holder) == {"cpu", "meta"}


def test_merge_joins_the_ranks_residency() -> None:
    ranks = [{"error": "", "residency": {"parameters": ["npu"], "outputs": ["npu"]}},
             {"error": "", "residency": {"parameters": ["cpu", "npu"], "outputs": ["npu"]}}, {"error": ""}]
    assert merge(ranks, (), ())["residency"] == {"parameters": ["cpu", "npu"], "outputs": ["npu"]}


def test_check_residency_passes_only_on_the_device() -> None:
    check_residency({"parameters": ["npu"], "optimizer": [], "inputs": ["npu"], "outputs": ["npu"]}, "npu")
    with pytest.raises(AssertionError, match="trained on other tensors: parameters on cpu; optimizer on cpu, npu"):
        check_residency({"parameters": ["cpu"], "optimizer": ["cpu", "npu"], "outputs": ["npu"]}, "npu")
    with pytest.raises(AssertionError, match="reported no residency"):
        check_residency(None, "npu")
    with pytest.raises(AssertionError, match="no tensors for outputs"):
        check_residency({"parameters": ["npu"], "outputs": []}, "npu")


def test_check_transfers_holds_each_part_to_its_budget() -> None:
    check_transfers({"fused_hash": {"steps": 4, "h2d": 12, "d2h": 4, "syncs": 4, "tables": 1},
                     "key_value": {"steps": 2, "h2d": 10, "d2h": 6, "syncs": 6, "tables": 2}})
    with pytest.raises(AssertionError, match="fused_hash: 2.00 d2h per call, budget 1"):
        check_transfers({"fused_hash": {"steps": 4, "h2d": 4, "d2h": 8, "syncs": 4, "tables": 1}})
    with pytest.raises(AssertionError, match="index_dedup: 1.50 syncs per call, budget 1"):
        check_transfers({"index_dedup": {"steps": 2, "h2d": 2, "d2h": 2, "syncs": 3, "tables": 1}})

"""H6 in this process: the host fallback counts its calls and warns once per op; a device TBE without kernels is
refused. Oracles: the CPU op itself, and the dispatcher's own kernel table (no PrivateUse1 kernels here)."""

from __future__ import annotations

import dataclasses
import warnings

import fbgemm_gpu  # noqa: F401  (defines torch.ops.fbgemm)
import pytest
import torch

from torchrec_ascend import backends
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.hooks import sparse_ops


def test_the_host_fallback_returns_the_cpu_result_counts_calls_and_warns_once() -> None:
    op = torch.ops.fbgemm.asynchronous_complete_cumsum.default
    name = "fbgemm::asynchronous_complete_cumsum (test)"
    wrapped = sparse_ops.host_round_trip(op, name)
    lengths = torch.tensor([2, 0, 3], dtype=torch.int64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [wrapped(lengths) for _ in range(3)]
    assert all(torch.equal(r, op(lengths)) for r in results)
    assert sparse_ops.fallback_calls()[name] == 3
    assert [str(w.message) for w in caught if name in str(w.message)] == [str(caught[0].message)], "once per op"
    assert "host fallback" in str(caught[0].message)


def test_a_device_tbe_without_device_kernels_is_refused_naming_the_op_and_the_choices() -> None:
    profile = dataclasses.replace(
        backends.profile_for("cpu"), name="dev", device_type="dev", device_tbe_ops=("asynchronous_complete_cumsum",)
    )
    assert sparse_ops.missing_device_tbe_ops(profile) == ["fbgemm::asynchronous_complete_cumsum"]
    with pytest.raises(ConfigError, match="cannot plan row_wise embedding tables on dev") as caught:
        sparse_ops.require_device_tbe(profile, "row_wise")
    assert "fbgemm::asynchronous_complete_cumsum" in str(caught.value)
    message = str(caught.value)
    assert "install a device-kernel library" in message and "plan these tables on the host" in message
    sparse_ops.require_device_tbe(backends.profile_for("cpu"), "row_wise")  # no device TBE ops: nothing to refuse
    assert sparse_ops.op_coverage(profile) == [("fbgemm::asynchronous_complete_cumsum", "no kernel")]


def test_the_h6_registration_is_a_registry_entry_that_applies_and_reverts() -> None:
    """Oracle: the dispatcher's own kernel table for PrivateUse1, before, while applied and after the revert."""
    from torchrec_ascend.injection.registry import PatchRegistry, PatchState

    op = "fbgemm::asynchronous_complete_cumsum"
    profile = dataclasses.replace(
        backends.profile_for("cpu"), name="dev", device_type="dev", host_fallback_ops=("asynchronous_complete_cumsum",)
    )

    def has_kernel() -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op, sparse_ops.DISPATCH_KEY)

    assert not has_kernel()
    with PatchRegistry([sparse_ops.host_fallback_patch(lambda: profile)]) as registry:
        assert registry.status("h6.host_fallback_ops").state is PatchState.APPLIED
        assert has_kernel() and op in sparse_ops.REGISTERED
        assert sparse_ops.op_coverage(profile) == [(op, "host fallback")]
    assert registry.status("h6.host_fallback_ops").state is PatchState.REVERTED
    assert not has_kernel() and op not in sparse_ops.REGISTERED
    assert sparse_ops.op_coverage(profile) == [(op, "no kernel")]


def test_the_process_registry_holds_the_h6_entry_first() -> None:
    import torchrec  # noqa: F401  (builds the process's registry)

    from torchrec_ascend.injection import autoload

    registry = autoload.registry()
    assert registry is not None, "these tests run under the entry point"
    assert registry.patches[0].name == "h6.host_fallback_ops"
    assert registry.status("h6.host_fallback_ops").state.value == "applied"

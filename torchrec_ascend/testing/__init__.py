"""Testing support for torchrec-ascend users and backend authors (as pytest ships ``pytester``).

:mod:`torchrec_ascend.testing.emulated_npu` is an EMULATED Ascend NPU: device type ``npu`` running on the host,
with its own device memory, streams, pinned memory, traffic counters, an HCCL-role collective backend over gloo
and fbgemm kernels standing in for fbgemm-ascend. It makes the accelerator path run without hardware; it says
nothing about speed or about the real NPU stack.

API (everything else is private)::

    from torchrec_ascend.testing import emulated_npu

    emulated_npu.install(device_count=8, withhold=emulated_npu.WITHHELD_BY_DEFAULT, stream_check=None)  # idempotent
    emulated_npu.set_stream_check(True), emulated_npu.stream_check_enabled(), emulated_npu.check_streams()
    emulated_npu.COLLECTIVE_BACKEND            # "hccl": init_process_group("cpu:gloo,npu:hccl")
    emulated_npu.counters()                    # Counts(h2d, h2d_bytes, d2h, d2h_bytes, d2d, syncs) so far
    with emulated_npu.measure() as step:       # counts of one block (a training step)
        ...
    step.counts.syncs
    step.threads                               # native thread id -> that thread's Counts in the block
    emulated_npu.thread_counters(), emulated_npu.thread_name(native_id)   # per live thread, since it started
    with emulated_npu.withhold_ops(["asynchronous_complete_cumsum"]):   # no npu kernel inside
        ...
    emulated_npu.withheld_ops(), emulated_npu.provided_ops(), emulated_npu.is_installed()

``install()`` also registers the torchrec-ascend device backend ``npu_emulated``
(:mod:`torchrec_ascend.testing.backend`: the npu profile minus torch_npu; ``TORCHREC_ASCEND_DEVICE=npu_emulated``
or ``auto``; ``TORCHREC_ASCEND_DEVICE=npu`` still means the real stack).

After ``install()``, ``torch.npu`` is :mod:`torchrec_ascend.testing.device_module` (is_available, device_count,
current_device, set_device, synchronize, Stream, Event, stream, current_stream, default_stream, set_stream,
memory_allocated, ...).
"""

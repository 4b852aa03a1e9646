"""The emulated NPU's stream-order check (``install(stream_check=...)``): races that hardware would show, named.

Oracle: CUDA's stream semantics (as PyTorch's CUDA Stream Sanitizer models them). Each scenario is a small program
with or without the ordering it needs; the ordered one must pass and the unordered one must fail, naming the op,
the tensor, both streams and both call sites.
"""

from __future__ import annotations

import signal
import textwrap
from typing import Any, Dict

import pytest

from fresh_interpreter import run_python

PRELUDE = """
import torch
from fresh_interpreter import report
from torchrec_ascend.testing import emulated_npu
emulated_npu.install()
npu = torch.npu
side = npu.Stream()
side.wait_stream(npu.current_stream())

def error(fn):
    try:
        fn()
    except RuntimeError as err:
        return str(err)
    return ""
"""

SCENARIOS = PRELUDE + """
facts = {}
x = torch.ones(4, device="npu")
side.wait_stream(npu.current_stream())
with npu.stream(side):
    y = x * 2                                   # written on the side stream
facts["unordered_read"] = error(lambda: y + 1)  # the default stream reads it without waiting

with npu.stream(side):
    z = x * 3
event = npu.Event(); event.record(side)
npu.current_stream().wait_event(event)
facts["event_wait"] = error(lambda: z + 1)

with npu.stream(side):
    w = x * 4
npu.current_stream().wait_stream(side)
facts["wait_stream"] = error(lambda: w + 1)

with npu.stream(side):
    v = x * 5
npu.synchronize()
facts["synchronize"] = error(lambda: v + 1)

read_here = x + 0                                # x read on the default stream ...
def write_on_side():
    with npu.stream(side):
        x.add_(1)                                # ... then written on the side stream without waiting
facts["unordered_write"] = error(write_on_side)

side.wait_stream(npu.current_stream())
with npu.stream(side):
    u = torch.ones(3, device="npu")              # allocated on the side stream
npu.current_stream().wait_stream(side)
u_used = u * 2                                   # used on the default stream, not recorded there
del u
facts["free_unrecorded"] = error(emulated_npu.check_streams)

with npu.stream(side):
    t = torch.ones(3, device="npu")
npu.current_stream().wait_stream(side)
t_used = t * 2
t.record_stream(npu.current_stream())
del t
facts["free_recorded"] = error(emulated_npu.check_streams)

on_device = torch.arange(6, device="npu")
host = on_device.to("cpu", non_blocking=True)
done = npu.Event(); done.record()
done.synchronize()
facts["waited_copy"] = host.tolist()

emulated_npu.set_stream_check(False)
with npu.stream(side):
    s = x * 2
facts["off"] = error(lambda: s + 1)
report(facts)
"""

IN_FLIGHT_READ = PRELUDE + """
on_device = torch.arange(6, device="npu")
host = on_device.to("cpu", non_blocking=True)
print(host.tolist())                              # read before any wait: stops the process
"""


@pytest.fixture(scope="module")
def facts() -> Dict[str, Any]:
    return run_python(textwrap.dedent(SCENARIOS))


def test_a_read_of_another_streams_unwaited_write_names_op_tensor_streams_and_sites(facts: Dict[str, Any]) -> None:
    message = facts["unordered_read"]
    assert message.startswith("stream-order check (emulated npu): aten::add"), message
    assert "on the default stream of npu:0 reads a Float tensor of shape [4]" in message, message
    assert "was written on stream" in message and "aten::mul" in message, message
    # Both call sites: the read (line of `y + 1`) and the earlier write (line of `x * 2`), in the program.
    assert message.count('<string>:') >= 2, message
    assert "wait_event" in message, "the error should say what to change"


def test_event_wait_stream_and_synchronize_order_the_streams(facts: Dict[str, Any]) -> None:
    assert facts["event_wait"] == facts["wait_stream"] == facts["synchronize"] == ""


def test_a_write_after_another_streams_unwaited_read_is_caught(facts: Dict[str, Any]) -> None:
    assert "writes a Float tensor" in facts["unordered_write"] and "was read on" in facts["unordered_write"]


def test_memory_freed_under_another_streams_use_needs_record_stream(facts: Dict[str, Any]) -> None:
    assert "no record_stream" in facts["free_unrecorded"], facts["free_unrecorded"]
    assert "record_stream(" in facts["free_unrecorded"], "the error should say what to change"
    assert facts["free_recorded"] == ""


def test_a_waited_non_blocking_copy_lands_and_the_check_can_be_turned_off(facts: Dict[str, Any]) -> None:
    assert facts["waited_copy"] == [0, 1, 2, 3, 4, 5]
    assert facts["off"] == ""


def test_a_host_read_of_an_in_flight_copy_stops_the_process_naming_both_sites() -> None:
    result = run_python(textwrap.dedent(IN_FLIGHT_READ), expect_exit=-signal.SIGSEGV)
    stderr = result["_stderr"]
    assert "host read of a pinned buffer" in stderr and "has not been waited for" in stderr, stderr
    assert "non_blocking device->host copy" in stderr and '<string>", line' in stderr, stderr  # copy and read

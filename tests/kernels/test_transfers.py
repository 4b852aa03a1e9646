"""Every copy between the host and a kernel's device is made in ``kernels/transfers.py``, nowhere else in ``kernels/``.

Oracle: the kernels' source, read with :mod:`ast`. A host-device copy is a call of ``.cpu()``/``.cuda()``/``.npu()``,
a ``.to(...)`` naming a device (a string, ``device=``, ``non_blocking=``, or a name or attribute ``device``), or a
``torch.tensor(..., device=...)``; dtype conversions (``.to(torch.float32)``, ``.to(weights.dtype)``) are not.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List

KERNELS = Path(__file__).resolve().parents[2] / "torchrec_ascend" / "kernels"
_MOVES = {"cpu", "cuda", "npu"}


def _names_a_device(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Attribute):
        return node.attr == "device" or node.attr.endswith("_device")
    if isinstance(node, ast.Name):
        return "device" in node.id
    return False


def copies(path: Path) -> List[str]:
    """``file:line call`` for every host-device copy in ``path``."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        attr, where = node.func.attr, f"{path.name}:{node.lineno} .{node.func.attr}()"
        keywords = {k.arg for k in node.keywords}
        if attr in _MOVES:
            hits.append(where)
        elif attr == "to" and (keywords & {"device", "non_blocking"} or any(map(_names_a_device, node.args))):
            hits.append(where)
        elif attr in ("tensor", "as_tensor") and "device" in keywords:
            hits.append(where)
    return hits


def test_the_kernels_copy_between_host_and_device_only_in_transfers():
    found = [hit for path in sorted(KERNELS.rglob("*.py")) if path.name != "transfers.py" for hit in copies(path)]
    assert found == []
    assert [hit.split()[1] for hit in copies(KERNELS / "transfers.py")] == [".to()", ".to()"]  # to_host, to_device


def test_the_scan_sees_each_kind_of_copy(tmp_path):
    """Teeth: the copies the kernels used to make are found; dtype conversions are not."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f(x, w, device):\n"
        "    a = x.cpu()\n"
        "    b = x.to('cpu')\n"
        "    c = x.to(w.device, non_blocking=True)\n"
        "    d = x.to(device)\n"
        "    e = torch.tensor([1], device=w.device)\n"
        "    return x.to(w.dtype), x.to(torch.float32), x.float()\n"
    )
    assert copies(probe) == [f"probe.py:{n} .{a}()" for n, a in [(2, "cpu"), (3, "to"), (4, "to"), (5, "to"),
                                                                  (6, "tensor")]]

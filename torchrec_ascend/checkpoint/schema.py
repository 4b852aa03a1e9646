"""What a save's ``metadata.json`` may hold, checked field by field before anything it describes is read.

A checkpoint travels between machines and teams, so its metadata is untrusted input: every field must have its
type and range (ints are JSON ints, never booleans or floats), every file name must be a plain name inside the
save's folder, every array entry must fit inside the data file it names (offset plus size within the file's
recorded size, shape consistent with dtype and byte count), and every shard's record blocks must have matching
lengths and the row width of its layout. Extra keys are ignored (forward compatibility within a format version);
missing ones are errors. :func:`check_metadata` looks only at the JSON; :func:`check_files` also compares the data
files on disk with their recorded sizes.

Example::

    metadata = read_json(path)
    check_metadata(path, metadata, version=3)
    check_files(directory, metadata)          # before a load reads any array
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from typing import Any, Dict

from torchrec_ascend.checkpoint.files import MAX_BYTES, array_spec, confined
from torchrec_ascend.errors import StorageError

MAX_VERSION = 10**8 - 1  # save directories are numbered with 8 digits
MAX_INT = 2**62  # IDs, steps, counters: int64 with room for the arithmetic done on them
RECORD_FIELDS = ("ids", "slots", "last_used", "rows")
_INT64 = ("<i8", "=i8")
_STATE_INTS = ("step", "iteration", "next_fresh")
_STATE_COUNTS = ("counters", "swaps")
_SHAPE_STATE = re.compile(r"^shape:\[(\d{1,12}(, \d{1,12})*)?\]$")  # as layout.py writes them: json.dumps of ints
_LAYOUT_INTS = ("dim", "col0", "cols", "bucket", "buckets", "row_offset", "rows", "capacity")
_LAYOUT_TEXTS = ("table", "optimizer", "eviction", "admission")


class _Bad(ValueError):
    """One rule a metadata field breaks (turned into a StorageError naming the file)."""


def check_metadata(path: str, metadata: Dict[str, Any], version: int) -> None:
    """Check the metadata of save ``version`` (read from ``path``) field by field.

    Raises:
        StorageError: a field is missing, of the wrong type or out of range, a file name could leave the save's
            folder, an array does not fit in its file, or the record blocks of a shard do not match its layout.

    Example::

        check_metadata("/ckpt/save-00000002/metadata.json", metadata, 2)
    """
    try:
        _check(metadata, version, os.path.dirname(path))
    except (_Bad, StorageError) as error:  # StorageError: from confined (a file name) and array_spec (an entry)
        raise StorageError(f"checkpoint file '{path}' is corrupted or crafted: {error}") from None


def check_files(directory: str, metadata: Dict[str, Any]) -> None:
    """Check that every data file of a save is a regular file inside ``directory`` of its recorded size.

    Raises:
        StorageError: a file is missing, not a regular file, a symbolic link leading out of the folder, or of
            another size (truncated or replaced).
    """
    for name, size in metadata["files"].items():
        path = confined(directory, name, "a data file")
        try:
            info = os.stat(path)
        except OSError as error:
            raise StorageError(f"checkpoint file '{path}' cannot be read: {error}; the save is incomplete") from None
        if not stat.S_ISREG(info.st_mode):
            raise StorageError(f"checkpoint file '{path}' is not a regular file; refusing to read it")
        actual = info.st_size
        if actual != size:
            raise StorageError(
                f"checkpoint file '{path}' has {actual} bytes but its save recorded {size}; it is truncated or was "
                "replaced: load an earlier checkpoint version"
            )


def _check(metadata: Dict[str, Any], version: int, directory: str) -> None:
    _typed(metadata, "format_version", int, "the metadata")
    for key, kind in (("id", str), ("kind", str), ("chain", list), ("world_size", int), ("files", dict),
                      ("shards", list), ("version", int)):
        _typed(metadata, key, kind, "the metadata")
    if metadata["version"] != version:
        raise _Bad(f"it says it is save {metadata['version']!r}, but it is in the folder of save {version}")
    if not isinstance(metadata.get("created"), (int, float)) or isinstance(metadata["created"], bool):
        raise _Bad("the field 'created' must be a number")
    chain = metadata["chain"]
    if (not chain or not all(_int_in(v, 1, MAX_VERSION) for v in chain) or chain != sorted(set(chain))
            or chain[-1] != version):
        raise _Bad(f"the chain {chain!r} is not ascending save numbers ending with this save ({version})")
    chain_kind = "full" if len(chain) == 1 else "incremental"
    if metadata["kind"] != chain_kind:
        raise _Bad(f"kind {metadata['kind']!r} does not match its chain {chain} (a {chain_kind} save)")
    if not _int_in(metadata["world_size"], 1, 1 << 24):
        raise _Bad(f"world_size {metadata['world_size']!r} is not a positive int")
    files = metadata["files"]
    for name, size in files.items():
        confined(directory, name, "a data file")
        if not _int_in(size, 0, MAX_BYTES):
            raise _Bad(f"data file {name!r} has size {size!r}, not a non-negative int")
    seen = set()
    for n, shard in enumerate(metadata["shards"]):
        _check_shard(shard, files, f"shard {n}")
        layout = shard["layout"]
        shard_key = (layout["table"], layout["col0"], layout["bucket"], layout["buckets"], layout["row_offset"])
        if shard_key in seen:
            raise _Bad(f"shard {n} repeats a shard of table {layout['table']!r} (columns from {layout['col0']}, "
                       f"row block {layout['bucket']} of {layout['buckets']})")
        seen.add(shard_key)


def _check_shard(shard: Any, files: Dict[str, int], where: str) -> None:
    if not isinstance(shard, dict):
        raise _Bad(f"{where} is a {type(shard).__name__}, not a JSON object")
    for key, kind in (("layout", dict), ("file", str), ("blocks", list), ("arrays", dict), ("state", dict)):
        _typed(shard, key, kind, where)
    layout = shard["layout"]
    width = _check_layout(layout, where)
    where = f"{where} (table {layout['table']!r})"
    if shard["file"] not in files:
        raise _Bad(f"{where} names data file {shard['file']!r}, which its files list does not hold")
    size = files[shard["file"]]
    for b, block in enumerate(shard["blocks"]):
        if not isinstance(block, dict) or any(f not in block for f in RECORD_FIELDS):
            raise _Bad(f"{where}: record block {b} needs the arrays {list(RECORD_FIELDS)}")
        specs = {f: _array(block[f], size, f"{where}, block {b}, {f}") for f in RECORD_FIELDS}
        n = specs["ids"][1][:1]
        for name in RECORD_FIELDS[:3]:
            dtype, shape = specs[name][:2]
            if dtype.str not in _INT64 or len(shape) != 1 or shape != n:
                expected = n[0] if n else "?"
                raise _Bad(f"{where}, block {b}: {name} must be int64 [{expected}], got {dtype.str} {list(shape)}")
        dtype, shape = specs["rows"][:2]
        if dtype.kind != "f" or shape != (*n, width):
            raise _Bad(f"{where}, block {b}: rows must be float [{n[0]}, {width}], got {dtype.str} {list(shape)}")
    arrays = shard["arrays"]
    if "removed" not in arrays:
        raise _Bad(f"{where}: the arrays lack 'removed'")
    for key, entry in arrays.items():
        dtype, shape = _array(entry, size, f"{where}, array {key!r}")[:2]
        if key == "removed" and (dtype.str not in _INT64 or len(shape) != 1):
            raise _Bad(f"{where}: 'removed' must be int64 [n], got {dtype.str} {list(shape)}")
    state = shard["state"]
    for key in _STATE_INTS:
        if key in state and not _int_in(state[key], 0, MAX_INT):
            raise _Bad(f"{where}: state {key!r} is {state[key]!r}, not a non-negative int")
    for key in _STATE_COUNTS:
        counts = state.get(key, {})
        if not isinstance(counts, dict) or not all(_int_in(v, 0, MAX_INT) for v in counts.values()):
            raise _Bad(f"{where}: state {key!r} must map names to non-negative ints")


def _check_layout(layout: Dict[str, Any], where: str) -> int:
    """Check a shard layout's fields; returns its packed row width."""
    for key in _LAYOUT_TEXTS:
        _typed(layout, key, str, f"{where}'s layout")
    for key in ("hash_ids", "key_value"):
        _typed(layout, key, bool, f"{where}'s layout")
    for key in _LAYOUT_INTS:
        if not _int_in(layout.get(key), 0, MAX_INT):
            raise _Bad(f"{where}'s layout: {key!r} is {layout.get(key)!r}, not a non-negative int")
    if layout["col0"] + layout["cols"] > layout["dim"] or not layout["bucket"] < layout["buckets"]:
        raise _Bad(f"{where}'s layout: columns {layout['col0']}+{layout['cols']} of {layout['dim']} or bucket "
                   f"{layout['bucket']} of {layout['buckets']} out of range")
    states = layout.get("states")
    if not isinstance(states, list):
        raise _Bad(f"{where}'s layout: 'states' must be a list")
    width = layout["cols"]
    for state in states:
        if state == "row":
            width += 1
        elif state == "element":
            width += layout["cols"]
        elif isinstance(state, str) and _SHAPE_STATE.match(state):
            width += math.prod(json.loads(state[len("shape:"):]))
        else:
            raise _Bad(f"{where}'s layout: optimizer state kind {state!r} is unknown")
    if width > MAX_BYTES:
        raise _Bad(f"{where}'s layout: rows of {width} elements")
    return width


def _array(entry: Any, file_size: int, where: str) -> Any:
    spec = array_spec(entry, where)  # a StorageError naming ``where``; check_metadata adds the file
    offset, nbytes = spec[2], spec[3]
    if offset + nbytes > file_size:
        raise _Bad(f"{where}: bytes {offset}..{offset + nbytes} lie beyond its data file's {file_size} bytes")
    return spec


def _typed(content: Dict[str, Any], key: str, kind: type, where: str) -> None:
    if key not in content:
        raise _Bad(f"{where} lacks the field {key!r}")
    value = content[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Bad(f"{where}: the field {key!r} is a {type(value).__name__}, not a {kind.__name__}")


def _int_in(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


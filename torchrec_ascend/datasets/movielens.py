"""MovieLens-100K as torch tensors: download, parse, and a leave-one-out split for sequential recommendation.

The data comes from the RecBole 1.2.1 wheel on PyPI, which ships ``recbole/dataset_example/ml-100k/`` in RecBole's
"atomic file" format (tab-separated, typed headers such as ``user_id:token``). The wheel is fetched once with
``pip download`` (RecBole itself is never installed) and the interactions are read straight out of it, so the only
network access is to the package index users already have configured.

Cache location, first match wins: the ``cache_dir`` argument, the ``TORCHREC_ASCEND_DATA`` environment variable,
``~/.cache/torchrec_ascend``. IDs stay raw (MovieLens user 1..943, item 1..1682): nothing is remapped, because hash
embedding tables take raw IDs.

Example::

    data = load_movielens_100k()
    len(data), data.num_users, data.num_items      # (100000, 943, 1682)
    trace = data.chronological().item              # item-ID access trace in time order
    split = leave_one_out(data)
    split.train_sequence(0), split.held_out[0]     # user split.users[0]: history, last item
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from torchrec_ascend.errors import ConfigError, StorageError

DATA_ENV = "TORCHREC_ASCEND_DATA"
RECBOLE_REQUIREMENT = "recbole==1.2.1"
RECBOLE_WHEEL = "recbole-1.2.1-py3-none-any.whl"
ML100K_INTER = "recbole/dataset_example/ml-100k/ml-100k.inter"
MAX_INTER_BYTES = 64 << 20  # the MovieLens-100K interaction file has 2.2 MB

# Columns every interaction file must have, as RecBole names them, and the dtype each becomes.
INTER_COLUMNS = {"user_id": torch.int64, "item_id": torch.int64, "rating": torch.float32, "timestamp": torch.float64}


@dataclasses.dataclass(frozen=True)
class Interactions:
    """User-item interactions, one entry per rating, in file order.

    Attributes:
        user: raw user IDs, int64 ``[N]``.
        item: raw item IDs, int64 ``[N]``.
        rating: explicit ratings, float32 ``[N]`` (MovieLens: 1..5).
        timestamp: seconds since the epoch, float64 ``[N]`` (the atomic file types it ``float``).

    Example::

        data = Interactions(torch.tensor([1, 1]), torch.tensor([7, 9]), torch.tensor([5.0, 3.0]),
                            torch.tensor([20.0, 10.0], dtype=torch.float64))
        data.chronological().item   # tensor([9, 7])
    """

    user: torch.Tensor
    item: torch.Tensor
    rating: torch.Tensor
    timestamp: torch.Tensor

    def __len__(self) -> int:
        return self.user.numel()

    @property
    def num_users(self) -> int:
        """Number of distinct users."""
        return int(torch.unique(self.user).numel())

    @property
    def num_items(self) -> int:
        """Number of distinct items (the catalogue that occurs in the data)."""
        return int(torch.unique(self.item).numel())

    @property
    def max_item_id(self) -> int:
        """Largest raw item ID; a stock (non-hash) table needs ``max_item_id + 1`` rows."""
        return int(self.item.max())

    def chronological(self) -> "Interactions":
        """The same interactions sorted by timestamp; ties keep file order (stable sort)."""
        order = torch.sort(self.timestamp, stable=True).indices
        return Interactions(self.user[order], self.item[order], self.rating[order], self.timestamp[order])


@dataclasses.dataclass(frozen=True)
class UserSequences:
    """Per-user chronological item sequences with the last item of each user held out (leave-one-out).

    The training sequences are stored jagged: user ``users[u]`` has items ``items[offsets[u]:offsets[u + 1]]``
    (oldest first) and ``held_out[u]`` is the item that came after all of them.

    Attributes:
        users: raw user IDs, int64 ``[U]``, ascending.
        offsets: int64 ``[U + 1]``, ``offsets[0] == 0``, ``offsets[-1] == items.numel()``.
        items: training items of all users, concatenated, int64 ``[N - U]``.
        held_out: each user's last item, int64 ``[U]``.

    Example::

        split = leave_one_out(data)
        history = split.train_sequence(0)       # items of user split.users[0], oldest first
        target = split.held_out[0]
    """

    users: torch.Tensor
    offsets: torch.Tensor
    items: torch.Tensor
    held_out: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        """Training sequence length per user, int64 ``[U]``."""
        return self.offsets[1:] - self.offsets[:-1]

    def train_sequence(self, index: int) -> torch.Tensor:
        """Training items of the ``index``-th user (not the raw user ID), oldest first."""
        return self.items[self.offsets[index] : self.offsets[index + 1]]


def default_cache_dir() -> Path:
    """``$TORCHREC_ASCEND_DATA`` if set, else ``~/.cache/torchrec_ascend``."""
    return Path(os.environ.get(DATA_ENV) or Path.home() / ".cache" / "torchrec_ascend")


def load_movielens_100k(cache_dir: Optional[Union[str, Path]] = None) -> Interactions:
    """Load the 100,000 MovieLens-100K ratings (943 users, 1,682 movies), downloading the data on first use.

    Args:
        cache_dir: where the RecBole wheel is kept; default :func:`default_cache_dir`.

    Returns:
        Interactions: in file order, raw IDs.

    Raises:
        StorageError: the wheel cannot be downloaded or read (the message says where to put it by hand), or the
            interaction file inside it is malformed.

    Example::

        data = load_movielens_100k("/tmp/data")
        data.max_item_id   # 1682
    """
    wheel = fetch_recbole_wheel(Path(cache_dir) if cache_dir is not None else default_cache_dir())
    advice = f"Delete the file so it is downloaded again, or replace it with a good copy of {RECBOLE_WHEEL} from PyPI."
    try:
        with open(wheel, "rb") as file, zipfile.ZipFile(file) as archive:
            size = archive.getinfo(ML100K_INTER).file_size
            if size > MAX_INTER_BYTES:  # checked before anything is decompressed: a crafted archive could ask for more
                raise StorageError(f"{wheel}!{ML100K_INTER} says it holds {size} bytes, more than the "
                                   f"{MAX_INTER_BYTES} an interaction file may have. {advice}")
            text = archive.read(ML100K_INTER).decode("utf-8")
    except StorageError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, OSError, EOFError, ValueError, RuntimeError,
            NotImplementedError, zlib.error) as err:  # what zipfile raises on damaged, encrypted or odd archives
        raise StorageError(f"cannot read {ML100K_INTER} from {wheel}: {type(err).__name__}: {err}. {advice}") from None
    return parse_inter_file(text, source=f"{wheel}!{ML100K_INTER}")


def fetch_recbole_wheel(cache_dir: Path) -> Path:
    """Return the path of the cached RecBole wheel, downloading it with ``pip download`` if missing.

    The download goes to a temporary folder next to the final path and is moved into place only when complete,
    so concurrent callers (ranks of one job) never read a partial file.

    Args:
        cache_dir: folder that holds (or will hold) ``recbole-1.2.1-py3-none-any.whl``.

    Returns:
        Path: the wheel.

    Raises:
        StorageError: ``pip download`` failed or produced no wheel (the message says where to place it by hand),
            or the cached wheel is not a regular file of the folder (a symbolic link leading out of it, a folder).

    Example::

        fetch_recbole_wheel(Path("/tmp/data"))   # PosixPath('/tmp/data/recbole-1.2.1-py3-none-any.whl')
    """
    wheel = cache_dir / RECBOLE_WHEEL
    if wheel.is_symlink() and os.path.commonpath([os.path.realpath(wheel), os.path.realpath(cache_dir)]) != \
            os.path.realpath(cache_dir):
        raise StorageError(f"{wheel} is a symbolic link leading out of the data cache folder (to "
                           f"{os.path.realpath(wheel)}); copy the wheel there instead of linking it.")
    if wheel.exists() and not wheel.is_file():
        raise StorageError(f"{wheel} is not a regular file; remove it so the wheel is downloaded again.")
    if wheel.is_file():
        return wheel
    manual = (
        f"Download {RECBOLE_WHEEL} from PyPI yourself (for example `pip download {RECBOLE_REQUIREMENT} --no-deps "
        f"-d {cache_dir}` on a machine with access) and place it at {wheel}, or point {DATA_ENV} at a folder "
        f"that holds it."
    )
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".download-", dir=cache_dir))
    except OSError as err:
        raise StorageError(f"cannot create the data cache folder {cache_dir}: {err}. {manual}") from err
    try:
        command = [sys.executable, "-m", "pip", "download", RECBOLE_REQUIREMENT, "--no-deps", "--quiet",
                   "--disable-pip-version-check", "-d", str(staging)]
        result = subprocess.run(command, capture_output=True, text=True)
        downloaded = staging / RECBOLE_WHEEL
        if result.returncode != 0 or not downloaded.is_file():
            output = (result.stderr or result.stdout).strip()[-2000:]
            raise StorageError(
                f"downloading the MovieLens-100K data ({RECBOLE_REQUIREMENT} wheel) failed with exit code "
                f"{result.returncode}: {output or 'no output'}. {manual}"
            )
        os.replace(downloaded, wheel)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return wheel


def parse_inter_file(text: str, source: str = "<string>") -> Interactions:
    """Parse a RecBole atomic interaction file (``.inter``) with integer user and item tokens.

    The first line is the typed header (``user_id:token<TAB>item_id:token<TAB>rating:float<TAB>timestamp:float``,
    in any order; extra columns are allowed and ignored); each further non-empty line is one interaction.

    Args:
        text: the whole file.
        source: file name used in error messages.

    Returns:
        Interactions: in file order.

    Raises:
        StorageError: a required column is missing, a line has the wrong number of fields, or a value does not
            parse (IDs must be non-negative integers, other values finite numbers); the message names the file, line
            and column.

    Example::

        parse_inter_file("user_id:token\\titem_id:token\\trating:float\\ttimestamp:float\\n1\\t7\\t5\\t100\\n")
    """
    lines = text.splitlines()
    if not lines:
        raise StorageError(f"{source} is empty: expected a typed header line such as 'user_id:token'.")
    names = [field.split(":", 1)[0] for field in lines[0].split("\t")]
    missing = [name for name in INTER_COLUMNS if name not in names]
    if missing:
        raise StorageError(
            f"{source}: header {lines[0]!r} lacks column(s) {missing}; an interaction file needs "
            f"{list(INTER_COLUMNS)} (RecBole atomic format, tab-separated, 'name:type')."
        )
    numbered = [(number, line.split("\t")) for number, line in enumerate(lines[1:], start=2) if line]
    for number, fields in numbered:
        if len(fields) != len(names):
            raise StorageError(f"{source}, line {number}: {len(fields)} fields, the header has {len(names)}.")
    rows = np.array([fields for _, fields in numbered], dtype=str).reshape(len(numbered), len(names))
    columns = {name: _column(rows, names.index(name), name, dtype, source) for name, dtype in INTER_COLUMNS.items()}
    return Interactions(columns["user_id"], columns["item_id"], columns["rating"], columns["timestamp"])


def _column(rows: np.ndarray, index: int, name: str, dtype: torch.dtype, source: str) -> torch.Tensor:
    """Convert one string column; on failure name the first offending line (the header is line 1)."""
    cells = rows[:, index]
    is_id = dtype == torch.int64
    try:
        parsed: Optional[np.ndarray] = cells.astype(np.int64 if is_id else np.float64)
    except (ValueError, OverflowError):
        parsed = None
    if parsed is not None and (bool((parsed >= 0).all()) if is_id else bool(np.isfinite(parsed).all())):
        return torch.from_numpy(parsed).to(dtype)
    bad = _first_bad(cells, is_id)
    rule = "a non-negative integer ID" if is_id else "a number"
    raise StorageError(f"{source}, line {bad + 2}, column {name!r}: {str(cells[bad])!r} is not {rule}.")


def _first_bad(cells: np.ndarray, is_id: bool) -> int:
    """Index of the first cell that does not parse (only called on the error path)."""
    for position, cell in enumerate(cells.tolist()):
        try:
            if (is_id and not 0 <= int(cell) < 2**63) or not math.isfinite(float(cell)):
                return position
        except ValueError:
            return position
    return 0


def leave_one_out(interactions: Interactions) -> UserSequences:
    """Split interactions into per-user chronological training sequences and one held-out last item per user.

    Each user's interactions are ordered by timestamp; ties keep file order, so the split is deterministic.

    Args:
        interactions: at least two interactions per user.

    Returns:
        UserSequences: users ascending.

    Raises:
        ConfigError: some user has a single interaction (nothing would be left to train on); the message lists
            them. Filter such users out first.

    Example::

        split = leave_one_out(load_movielens_100k())
        split.users.numel(), split.items.numel()   # (943, 99057)
    """
    by_time = interactions.chronological()
    order = torch.sort(by_time.user, stable=True).indices
    users_sorted, items_sorted = by_time.user[order], by_time.item[order]
    users, counts = torch.unique_consecutive(users_sorted, return_counts=True)
    single = users[counts < 2]
    if single.numel():
        raise ConfigError(
            f"leave-one-out needs at least 2 interactions per user; {single.numel()} user(s) have one "
            f"(first: {single[:5].tolist()}). Drop those users before splitting."
        )
    last = torch.cumsum(counts, 0) - 1
    keep = torch.ones_like(items_sorted, dtype=torch.bool)
    keep[last] = False
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts - 1, 0)])
    return UserSequences(users, offsets, items_sorted[keep], items_sorted[last])

"""Every bad input of the catalogue (``conformance_tests/errors/catalogue.py``, the table the README lists) raises
its documented exception with a message naming what is wrong. Sharded rows run on a one-rank gloo group."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchrec_ascend.conformance_tests.errors.catalogue import CATALOGUE, BadInput, message_of, readme_table

pytestmark = pytest.mark.usefixtures("one_rank_group")


@pytest.mark.parametrize("row", CATALOGUE, ids=lambda row: f"{row.area}-{row.kind}")
def test_bad_input_raises_its_documented_error(row: BadInput, tmp_path: Path) -> None:
    message = message_of(row, tmp_path)
    assert row.fragment in message, f"{row.input}: the {row.raises.__name__} does not say {row.fragment!r}: {message!r}"


def test_catalogue_covers_every_area() -> None:
    areas = {row.area for row in CATALOGUE}
    assert {"configs", "constraints", "IDs", "batches", "policies", "plugins", "devices", "versions", "checkpoints",
            "disks"} <= areas
    assert len({row.kind for row in CATALOGUE}) == len(CATALOGUE) >= 25


def test_readme_table_has_a_row_per_input() -> None:
    table = readme_table({row.kind: "message" for row in CATALOGUE})
    assert len(table.splitlines()) == len(CATALOGUE) + 2

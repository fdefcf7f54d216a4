"""The message-file layer on its own: paths stay inside the exchange folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from mainspring.exchange import files


@pytest.mark.parametrize("relative", ["../outside", "mailboxes/../../outside", "/etc/passwd", "", "."])
def test_a_path_that_leaves_the_exchange_folder_is_refused(tmp_path: Path, relative: str) -> None:
    disk = files.Disk(tmp_path / "exchange")
    with pytest.raises(ValueError, match="leaves the exchange folder"):
        disk.full(relative)


def test_a_path_inside_the_exchange_folder_is_the_folder_joined_with_it(tmp_path: Path) -> None:
    disk = files.Disk(tmp_path / "exchange")
    assert disk.full("mailboxes/mobile-a/db-1/m1") == (tmp_path / "exchange/mailboxes/mobile-a/db-1/m1").resolve()
    assert disk.full("unknown/p1/../p2/m1") == disk.root / "unknown/p2/m1"

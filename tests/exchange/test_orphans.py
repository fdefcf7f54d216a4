"""Message files nobody was told about (a body written, its row never committed) are swept once they are
older than ``exchange.orphan_grace_ms``; recorded messages, young files and foreign files are left alone."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from mainspring.config import Settings
from mainspring.exchange import files
from mainspring.exchange.messages import new_id
from mainspring.exchange.orphans import message_id_in, sweep_orphan_files
from mainspring.store import ManualClock
from tests.exchange.conftest import MAILBOX, files_under, listed, put

GRACE_MS = 600_000
FOLDER = "mailboxes/mobile-a/db-1"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The server's own sweeper waits well past the grace period, so that the sweeps these tests run are the
    only ones (its default interval is the grace period: advancing the clock past it woke the server's sweeper
    too, and whichever ran first removed the file)."""
    exchange = settings.exchange.model_copy(update={"orphan_grace_ms": GRACE_MS, "orphan_sweep_interval_ms": 100 * GRACE_MS})
    return settings.model_copy(update={"exchange": exchange})


def test_message_and_temp_file_names_are_told_from_foreign_ones() -> None:
    message_id = new_id("m", 1_800_000_000_123)
    assert message_id_in(message_id) == (message_id, 1_800_000_000_123)
    assert message_id_in(f".{message_id}.1a2b3c4d.tmp") == (message_id, 1_800_000_000_123)
    assert message_id_in("notes.txt") is None
    assert message_id_in(message_id + ".bak") is None


async def test_a_body_whose_commit_failed_and_could_not_be_deleted_is_swept_after_the_grace_period(
    app: Any, client: Any, clock: ManualClock, disk: Any, exchange_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = (await put(client, b"recorded"))["id"]
    store = app.state.context.store

    @contextlib.asynccontextmanager
    async def crashing(*_args: Any, **_kwargs: Any) -> AsyncIterator[Any]:
        raise OSError("the server died between writing the body and recording it")
        yield  # pragma: no cover

    monkeypatch.setattr(store, "transaction", crashing)
    disk.fail("_unlink")  # and the clean-up of the body failed too
    answer = await client.post(f"{MAILBOX}/messages", content=b"never acknowledged")
    assert answer.status_code >= 500
    monkeypatch.undo()
    disk.heal()
    (orphan,) = [f for f in files_under(exchange_dir) if kept not in f]
    assert orphan.startswith(f"{FOLDER}/m")  # the body the failed store left behind
    foreign = exchange_dir / FOLDER / "notes.txt"
    foreign.write_text("not ours")

    assert await sweep_orphan_files(app.state.context) == 0  # younger than the grace period
    clock.advance(GRACE_MS + 1)
    assert await sweep_orphan_files(app.state.context) == 1
    assert files_under(exchange_dir) == {f"{FOLDER}/{kept}", f"{FOLDER}/notes.txt"}
    assert [m["id"] for m in (await listed(client))["messages"]] == [kept]
    assert await sweep_orphan_files(app.state.context) == 0


async def test_a_temp_file_left_by_a_crash_mid_write_is_swept(app: Any, clock: ManualClock, exchange_dir: Any) -> None:
    message_id = new_id("m", clock.now_ms())
    folder = exchange_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f".{message_id}.0badc0de.tmp").write_bytes(b"half a bo")
    clock.advance(GRACE_MS + 1)
    assert await sweep_orphan_files(app.state.context) == 1
    assert files_under(exchange_dir) == set()


def test_mailbox_files_lists_only_files_under_mailboxes(tmp_path: Any) -> None:
    disk = files.Disk(tmp_path)
    disk.write_atomic(f"{FOLDER}/m1", b"x")
    disk.write_atomic("unknown/p1/m2", b"y")
    disk.write_atomic("backup/mobile-a/db-1/m3", b"z")
    assert list(disk.mailbox_files()) == [f"{FOLDER}/m1"]

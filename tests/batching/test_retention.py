"""Retention: finished packages and their tasks go after ``batching.retention_ms``; the version log and
what a reader still needs stay."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from mainspring.batching import service
from mainspring.batching.tables import batch_packages, batch_tasks, batch_versions
from mainspring.config import Settings, load_settings
from mainspring.store import ManualClock, Store
from tests.batching.conftest import claim, eventually, put_batcher, submit, submit_pair, task, wait_status

DAY_MS = 86_400_000


def _settings(database_url: str, tmp_path: Path, **batching: object) -> Settings:
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 100, "sqlite_synchronous": "NORMAL"},
        batching={"worker_poll_ms": 100, **batching},
    )


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    """No retention loop: these tests prune themselves, at a moment they choose."""
    chosen = _settings(database_url, tmp_path)
    chosen.batching.retention_ms = None  # (load_settings takes None for "not given")
    return chosen


async def _finish(client: httpx.AsyncClient, ok: bool = True) -> str:
    package = await claim(client)
    assert package is not None
    token = package["lease"]["token"]
    if ok:
        answer = await client.post(f"/v1/packages/{package['id']}/complete", json={"token": token})
    else:
        answer = await client.post(f"/v1/packages/{package['id']}/fail", json={"token": token, "error": "bad", "retry": False})
    assert answer.status_code == 200, answer.text
    return str(package["id"])


async def _count(store: Store, table, *where) -> int:
    async with store.read() as conn:
        return int((await conn.execute(select(func.count()).select_from(table).where(*where))).scalar_one())


async def test_retention_prunes_finished_packages_and_keeps_what_a_reader_still_needs(client, clock: ManualClock, store: Store) -> None:
    await put_batcher(client, max_wait_ms=30 * DAY_MS)  # a lone task stays pending through the whole test
    # Old and finished: pair 79 done at versions 1, 2 and 3, a failed pair, and a duplicate rejected at once.
    await submit_pair(client, "79")
    clock.advance(5000)
    await wait_status(client, ["79-en", "79-ru"], "packed")
    done = [await _finish(client)]
    for edition in (2, 3):
        await submit(client, f"79-en-{edition}", "79", "en", f"edition {edition}")
        await submit(client, f"79-ru-{edition}", "79", "ru", f"edition {edition} ru")
        clock.advance(5000)
        await wait_status(client, [f"79-en-{edition}", f"79-ru-{edition}"], "packed")
        done.append(await _finish(client))
    await submit(client, "79-en-dup", "79", "en", "edition 3", expect=200)
    await submit_pair(client, "83")
    clock.advance(5000)
    await wait_status(client, ["83-en", "83-ru"], "packed")
    failed = await _finish(client, ok=False)

    clock.advance(8 * DAY_MS)
    # Still needed, however old: a claimed package, a ready one, a pending task.
    await submit_pair(client, "80")
    clock.advance(5000)
    await wait_status(client, ["80-en", "80-ru"], "packed")
    claimed = await claim(client)
    assert claimed is not None
    await submit_pair(client, "81")
    clock.advance(5000)
    [ready] = await wait_status(client, ["81-en"], "packed")
    await submit(client, "82-en", "82", "en")
    clock.advance(8 * DAY_MS)
    log_lines = await _count(store, batch_versions)

    pruned = await service.prune_finished(store, clock.now_ms() - 7 * DAY_MS, 500)
    assert (pruned.packages, pruned.tasks, pruned.rejected) == (4, 4, 1)
    async with store.read() as conn:
        kept = set((await conn.execute(select(batch_packages.c.id))).scalars())
        tasks = set((await conn.execute(select(batch_tasks.c.id))).scalars())
    assert kept == {claimed["id"], ready["package_id"]} and not kept & {*done, failed}
    # 79's versions 1 and 2 are gone; its latest (3) stays for a later reissue, and so does 83's content
    # though its package failed.
    assert tasks == {"79-en-3", "79-ru-3", "83-en", "83-ru", "80-en", "80-ru", "81-en", "81-ru", "82-en"}
    assert await _count(store, batch_versions) == log_lines
    assert (await task(client, "82-en"))["status"] == "pending"
    # Dedup keeps working on the permanent log: the pruned first edition is still a duplicate.
    dup = await submit(client, "79-en-old", "79", "en", "79 in en ", expect=200)
    assert (dup["status"], dup["reason"], dup["version"]) == ("rejected", "duplicate", 1)
    # A second pass finds nothing more.
    again = await service.prune_finished(store, clock.now_ms() - 7 * DAY_MS, 500)
    assert (again.packages, again.tasks, again.rejected) == (0, 0, 0)


async def test_retention_deletes_in_batches_of_the_setting(client, clock: ManualClock, store: Store) -> None:
    await put_batcher(client)
    for book in ("1", "2", "3"):
        await submit_pair(client, book)
        clock.advance(5000)
        await wait_status(client, [f"{book}-en"], "packed")
        await _finish(client)
    clock.advance(8 * DAY_MS)
    first = await service.prune_finished(store, clock.now_ms() - 7 * DAY_MS, 2)
    assert first.packages == 2 and first.filled(2)
    second = await service.prune_finished(store, clock.now_ms() - 7 * DAY_MS, 2)
    assert second.packages == 1 and not second.filled(2)


class TestTheRetentionLoop:
    @pytest.fixture
    def settings(self, database_url: str, tmp_path: Path) -> Settings:
        return _settings(database_url, tmp_path, retention_ms=60_000, retention_interval_ms=50)

    async def test_the_server_prunes_by_itself_after_retention_ms(self, client, clock: ManualClock, store: Store) -> None:
        await put_batcher(client)
        await submit_pair(client, "79")
        clock.advance(5000)
        await wait_status(client, ["79-en"], "packed")
        package_id = await _finish(client)
        clock.advance(60_001)

        async def gone() -> bool:
            return (await client.get(f"/v1/packages/{package_id}")).status_code == 404

        await eventually(gone, what="the finished package to be pruned")

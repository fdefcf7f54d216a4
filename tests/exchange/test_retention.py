"""Finished processes leave the list (seed 000, API.md §1): DONE and ABORTED processes, with the message rows
that ended with them, are removed ``finished_retention_ms`` after they finished — never before their cleanup
is over, never a live one. Time is moved with the ManualClock."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select

from mainspring.exchange import data
from mainspring.exchange.retention import remove_finished_processes, retention_step
from mainspring.exchange.sync import sync_all_once
from mainspring.exchange.tables import exchange_messages as M
from mainspring.exchange.watchdog import recover
from tests.conftest import eventually
from tests.exchange.conftest import event_types, listed, put, settle, start

RETENTION_MS = 3_600_000
PR = "/v1/exchange/processes"


@pytest.fixture
def retention_ms() -> int | None:
    return RETENTION_MS


@pytest.fixture
def settings(settings, retention_ms):
    settings.exchange.finished_retention_ms = retention_ms
    # Live processes stay live while the clock moves past the retention.
    settings.exchange.process_timeout_ms = settings.exchange.commit_timeout_ms = 100 * RETENTION_MS
    return settings


def box(database: str) -> str:
    return f"/v1/exchange/mailboxes/mobile-a/{database}"


async def started(client, database: str, n: int = 2) -> tuple[list[str], str]:
    ids = [(await put(client, f"{database}-{i}".encode(), mailbox=box(database)))["id"] for i in range(n)]
    response = await start(client, ids, mailbox=box(database))
    assert response.status_code == 201, response.text
    return ids, response.json()["id"]


async def ready(client, pid: str, reply_to: str | None = None) -> None:
    replies = [{"addressee": "mobile-a", "database": reply_to, "body": "receipt"}] if reply_to else []
    assert (await client.post(f"{PR}/{pid}/ready", json={"replies": replies})).status_code == 200


async def done(client, database: str, reply_to: str | None = None) -> tuple[list[str], str]:
    ids, pid = await started(client, database)
    await ready(client, pid, reply_to)
    assert (await client.post(f"{PR}/{pid}/committed")).json()["state"] == "DONE"
    return ids, pid


async def aborted(client, database: str) -> tuple[list[str], str]:
    ids, pid = await started(client, database)
    await ready(client, pid, reply_to="receipts-of-aborted")
    assert (await client.post(f"{PR}/{pid}/commit-failed", json={})).json()["state"] == "ABORTED"
    return ids, pid


async def state_of(client, pid: str) -> str:
    response = await client.get(f"{PR}/{pid}")
    if response.status_code == 404:
        assert response.json()["code"] == "process_not_found"
        return "removed"
    return response.json()["state"]


async def message_rows(store, ids: list[str]) -> set[str]:
    async with store.read() as conn:
        return set((await conn.execute(select(M.c.id).where(M.c.id.in_(ids)))).scalars())


async def heal(app, disk) -> None:
    """The disk works again: every pending move is tried now (as at start-up), due or not — a watchdog round
    that was failing on the broken disk may just have pushed their retries later."""
    disk.heal()
    await sync_all_once(app.state.context)
    await settle(app)


async def remove_all(ctx) -> None:
    """Remove every finished process due now. The background loop may be removing some of them at the same
    moment (holding their rows until it commits), so wait until none that is due is left, like ``settle``."""
    retention = ctx.settings.exchange.finished_retention_ms
    for _ in range(100):
        while await remove_finished_processes(ctx):
            pass
        async with ctx.store.read() as conn:
            oldest = await data.oldest_removable_finish(conn)
        if retention is None or oldest is None or oldest > ctx.now_ms() - retention:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("finished processes past their retention were left")


async def test_removes_exactly_the_finished_processes_past_retention(app, client, clock, disk, store):
    ctx = app.state.context
    # In doubt before anything else: recovery turns every READY_TO_COMMIT into IN_DOUBT.
    _, in_doubt = await started(client, "in-doubt")
    await ready(client, in_doubt)
    quarantined_ids, moving_back = await started(client, "moving-back")
    await ready(client, moving_back)
    await recover(ctx)
    done_ids, finished = await done(client, "done", reply_to="receipts")
    aborted_ids, given_up = await aborted(client, "aborted")
    _, cleaning = await started(client, "cleanup")
    await ready(client, cleaning)
    _, live = await started(client, "started")
    _, readied = await started(client, "ready")
    await ready(client, readied)
    _, recent = await started(client, "recent")
    disk.fail("_unlink", "_replace")
    assert (await client.post(f"{PR}/{cleaning}/committed")).json()["state"] == "CLEANUP"
    # ABORTED, but its files are still to come back from unknown/: its cleanup is not over.
    assert (await client.post(f"{PR}/{moving_back}/commit-failed", json={})).json()["state"] == "ABORTED"
    clock.advance(RETENTION_MS // 2)
    # Aborted before API_3: no file has to move, so it is finished at once, half a retention later.
    assert (await client.post(f"{PR}/{recent}/commit-failed", json={})).json()["state"] == "ABORTED"
    clock.advance(RETENTION_MS // 2)

    # The background loop may remove some of them at the same moment: the end state is what counts.
    await remove_all(ctx)
    states = {pid: await state_of(client, pid)
              for pid in (finished, given_up, cleaning, moving_back, live, readied, in_doubt, recent)}
    assert states == {finished: "removed", given_up: "removed", cleaning: "CLEANUP", moving_back: "ABORTED",
                      live: "STARTED", readied: "READY_TO_COMMIT", in_doubt: "IN_DOUBT", recent: "ABORTED"}
    # The committed messages went with their process; its reply was published and stays; the messages an
    # aborted process gave back stay available.
    assert await message_rows(store, done_ids) == set()
    assert len((await listed(client, box("receipts")))["messages"]) == 1
    assert {m["id"] for m in (await listed(client, box("aborted")))["messages"]} == set(aborted_ids)
    assert (await listed(client, box("receipts-of-aborted")))["messages"] == []
    assert "exchange.process.removed" in await event_types(store, finished)

    # Once the disk heals, the cleanups end; each is removed when its own retention has passed.
    await heal(app, disk)
    assert await state_of(client, cleaning) == "DONE"
    await remove_all(ctx)  # moving_back finished long ago; only its files were waiting
    assert await state_of(client, moving_back) == "removed"
    assert {m["id"] for m in (await listed(client, box("moving-back")))["messages"]} == set(quarantined_ids)
    clock.advance(RETENTION_MS)
    await remove_all(ctx)
    assert {await state_of(client, cleaning), await state_of(client, recent)} == {"removed"}
    assert await state_of(client, live) == "STARTED"


async def test_the_loop_sleeps_until_the_next_process_falls_due(app, client, clock):
    assert await retention_step(app.state.context) is None
    await done(client, "done")
    finished_at = clock.now_ms()
    assert await retention_step(app.state.context) == finished_at + RETENTION_MS


async def test_a_message_id_is_idempotent_while_its_row_is_kept(app, client, clock):
    first = await put(client, b"order", mailbox=box("idem"), **{"Message-Id": "order-1"})
    response = await start(client, [first["id"]], mailbox=box("idem"))
    pid = response.json()["id"]
    await ready(client, pid)
    await client.post(f"{PR}/{pid}/committed")
    assert (await put(client, b"order", mailbox=box("idem"), **{"Message-Id": "order-1"}))["id"] == first["id"]
    clock.advance(RETENTION_MS)
    await remove_all(app.state.context)
    assert (await put(client, b"order", mailbox=box("idem"), **{"Message-Id": "order-1"}))["id"] != first["id"]


@pytest.mark.parametrize("retention_ms", [0])
async def test_zero_removes_as_soon_as_the_cleanup_is_over(app, client, clock, disk):
    _, finished = await done(client, "done")
    _, given_up = await aborted(client, "aborted")
    _, cleaning = await started(client, "cleanup")
    await ready(client, cleaning)
    disk.fail("_unlink")
    await client.post(f"{PR}/{cleaning}/committed")

    async def removed() -> bool:
        return {await state_of(client, finished), await state_of(client, given_up)} == {"removed"}

    await eventually(removed, what="the retention loop to remove the finished processes by itself")
    assert await state_of(client, cleaning) == "CLEANUP"
    await heal(app, disk)
    await remove_all(app.state.context)
    assert await state_of(client, cleaning) == "removed"


@pytest.mark.parametrize("retention_ms", [None])
async def test_none_keeps_every_finished_process(app, client, clock):
    _, finished = await done(client, "done")
    _, given_up = await aborted(client, "aborted")
    clock.advance(10 * 365 * 86_400_000)
    await remove_all(app.state.context)
    assert await retention_step(app.state.context) is None
    assert (await state_of(client, finished), await state_of(client, given_up)) == ("DONE", "ABORTED")


@pytest.mark.parametrize("retention_ms", [0])
async def test_api_4_and_api_5_answer_the_finished_process_when_retention_removes_it_at_once(
        app, client, monkeypatch):
    """With retention 0 the loop is woken as the process finishes and may remove it before the call's answer
    is built: the answer is the process as the call left it, never 404. The race is made certain here by
    removing right after the call's own file moves; the loop itself also runs and may win it first."""
    from mainspring.exchange import sync

    own_moves, own_cleanup = sync.sync_process_files, sync.clean_up_committed

    async def then_retention(ctx, process_id):
        await own_moves(ctx, process_id)
        await remove_all(ctx)

    async def cleanup_then_retention(ctx, process_id, rows):
        done = await own_cleanup(ctx, process_id, rows)
        await remove_all(ctx)
        return done

    monkeypatch.setattr(sync, "sync_process_files", then_retention)
    monkeypatch.setattr(sync, "clean_up_committed", cleanup_then_retention)
    for cycle in range(3):
        _, pid = await started(client, f"failed-{cycle}")
        await ready(client, pid, reply_to="receipts")
        response = await client.post(f"{PR}/{pid}/commit-failed", json={"error": "rolled back"})
        assert response.status_code == 200, response.text
        assert (response.json()["id"], response.json()["state"], response.json()["error"]) == (
            pid, "ABORTED", "rolled back")
        _, pid = await started(client, f"done-{cycle}")
        await ready(client, pid, reply_to="receipts")
        response = await client.post(f"{PR}/{pid}/committed")
        assert response.status_code == 200, response.text
        assert (response.json()["id"], response.json()["state"]) == (pid, "DONE")
        assert await state_of(client, pid) == "removed"

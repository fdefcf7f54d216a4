"""Start-up recovery (API.md §1 and the seed's start-up rules), and repairing a crash between a
decision in the store and the file move that follows it."""

from __future__ import annotations

import asyncio
import os
import shutil

import httpx
from sqlalchemy import select

from mainspring.api import create_app
from mainspring.exchange import data
from mainspring.exchange.data import MessageRow
from mainspring.exchange.sync import Outcome, record_file_moves
from mainspring.exchange.tables import exchange_messages as M
from mainspring.exchange.tables import exchange_processes as P
from mainspring.exchange.watchdog import recover
from tests.exchange.conftest import (
    COMMIT_TIMEOUT_MS,
    MAILBOX,
    PROCESS_TIMEOUT_MS,
    event_types,
    files_under,
    listed,
    open_alerts,
    process,
    put,
    settle,
    start,
)

PR = "/v1/exchange/processes"


async def started(client, n=1, mailbox=MAILBOX):
    ids = [(await put(client, f"body-{i}".encode(), mailbox=mailbox))["id"] for i in range(n)]
    response = await start(client, ids, mailbox=mailbox)
    assert response.status_code == 201, response.text
    return ids, response.json()["id"]


async def snapshot(store, exchange_dir):
    async with store.read() as conn:
        processes = sorted((r.id, r.state) for r in (await conn.execute(select(P.c.id, P.c.state))).all())
        messages = sorted((r.id, r.state, r.path, r.synced) for r in (await conn.execute(
            select(M.c.id, M.c.state, M.c.path, M.c.synced))).all())
    return processes, messages, files_under(exchange_dir)


async def test_startup_drops_cancelled_processes(app, client, clock):
    ids, pid = await started(client)
    clock.advance(PROCESS_TIMEOUT_MS)
    await settle(app)
    assert (await process(client, pid))["state"] == "CANCELLED"
    await recover(app.state.context)
    gone = await client.get(f"{PR}/{pid}")
    assert gone.status_code == 404 and gone.json()["code"] == "process_not_found"
    assert [m["id"] for m in (await listed(client))["messages"]] == ids
    assert (await client.post(f"{PR}/{pid}/ready")).json()["code"] == "cancelled"


async def test_startup_finishes_cleanup(app, client, disk, exchange_dir):
    _ids, pid = await started(client, 2)
    await client.post(f"{PR}/{pid}/ready")
    disk.fail("_unlink")
    response = await client.post(f"{PR}/{pid}/committed")
    assert response.status_code == 200 and response.json()["state"] == "CLEANUP"
    disk.heal()
    await recover(app.state.context)
    assert (await process(client, pid))["state"] == "DONE"
    assert files_under(exchange_dir) == set()


async def test_startup_turns_ready_to_commit_into_in_doubt(app, client, exchange_dir, store):
    ids, pid = await started(client, 2)
    await client.post(f"{PR}/{pid}/ready")
    await recover(app.state.context)
    assert (await process(client, pid))["state"] == "IN_DOUBT"
    assert files_under(exchange_dir) == {f"unknown/{pid}/{i}" for i in ids}
    assert [a.subject_id for a in await open_alerts(store, "exchange_in_doubt")] == [pid]
    assert (await client.post(f"{PR}/{pid}/committed")).json()["state"] == "DONE"


async def test_startup_keeps_the_deadline_of_started_processes(app, client, clock):
    _, pid = await started(client)
    before = await process(client, pid)
    clock.advance(PROCESS_TIMEOUT_MS // 2)
    await recover(app.state.context)
    after = await process(client, pid)
    assert after["state"] == "STARTED" and after["deadline"] == before["deadline"]
    clock.advance(PROCESS_TIMEOUT_MS // 2)
    await settle(app)
    assert (await process(client, pid))["state"] == "CANCELLED"


async def test_startup_leaves_in_doubt_done_and_aborted_alone(app, client, clock, store, exchange_dir):
    _, doubt = await started(client, 1, mailbox="/v1/exchange/mailboxes/a/x")
    await client.post(f"{PR}/{doubt}/ready")
    clock.advance(COMMIT_TIMEOUT_MS)
    await settle(app)
    _, done = await started(client, 1, mailbox="/v1/exchange/mailboxes/b/x")
    await client.post(f"{PR}/{done}/ready")
    await client.post(f"{PR}/{done}/committed")
    _, aborted = await started(client, 1, mailbox="/v1/exchange/mailboxes/c/x")
    await client.post(f"{PR}/{aborted}/commit-failed")
    before = await snapshot(store, exchange_dir)
    await recover(app.state.context)
    assert await snapshot(store, exchange_dir) == before


async def test_recovery_run_twice_ends_in_the_same_state(app, client, clock, store, exchange_dir, disk):
    _, ready = await started(client, 2, mailbox="/v1/exchange/mailboxes/a/x")
    await client.post(f"{PR}/{ready}/ready")
    _, cleanup = await started(client, 2, mailbox="/v1/exchange/mailboxes/b/x")
    await client.post(f"{PR}/{cleanup}/ready")
    disk.fail("_unlink")
    await client.post(f"{PR}/{cleanup}/committed")
    disk.heal()
    _, live = await started(client, 1, mailbox="/v1/exchange/mailboxes/c/x")
    ctx = app.state.context
    await recover(ctx)
    first = await snapshot(store, exchange_dir)
    await recover(ctx)
    assert await snapshot(store, exchange_dir) == first
    states = dict(first[0])
    assert (states[ready], states[cleanup], states[live]) == ("IN_DOUBT", "DONE", "STARTED")


async def test_crash_after_the_decision_before_the_file_move_is_repaired(app, client, disk, exchange_dir):
    ids, pid = await started(client, 2)
    await client.post(f"{PR}/{pid}/ready")
    disk.fail("_replace")
    await recover(app.state.context)  # decides IN_DOUBT; the moves to unknown/ fail (as if it crashed)
    assert (await process(client, pid))["state"] == "IN_DOUBT"
    assert files_under(exchange_dir) == {f"mailboxes/mobile-a/db-1/{i}" for i in ids}
    assert (await listed(client))["messages"] == [], "undecided files are never listed"
    disk.heal()
    await recover(app.state.context)
    assert files_under(exchange_dir) == {f"unknown/{pid}/{i}" for i in ids}


async def test_crash_after_the_file_move_before_it_was_recorded_is_repaired(app, client, disk, exchange_dir, store):
    ids, pid = await started(client, 2)
    await client.post(f"{PR}/{pid}/ready")
    disk.fail("_replace")
    await recover(app.state.context)
    disk.heal()
    # The move happened, the store never heard of it: as if the server died right after the rename.
    (exchange_dir / "unknown" / pid).mkdir(parents=True, exist_ok=True)
    shutil.move(exchange_dir / "mailboxes/mobile-a/db-1" / ids[0], exchange_dir / "unknown" / pid / ids[0])
    await recover(app.state.context)
    assert files_under(exchange_dir) == {f"unknown/{pid}/{i}" for i in ids}
    async with store.read() as conn:
        assert all(r.synced for r in (await conn.execute(select(M.c.synced).where(M.c.process_id == pid))).all())
    assert await open_alerts(store, "exchange_message_file_missing") == []


async def test_crash_after_a_delete_before_it_was_recorded_is_repaired(app, client, disk, exchange_dir):
    ids, pid = await started(client, 2)
    await client.post(f"{PR}/{pid}/ready")
    disk.fail("_unlink")
    assert (await client.post(f"{PR}/{pid}/committed")).json()["state"] == "CLEANUP"
    disk.heal()
    (exchange_dir / "mailboxes/mobile-a/db-1" / ids[0]).unlink()  # deleted, not recorded
    await recover(app.state.context)
    assert (await process(client, pid))["state"] == "DONE"
    assert files_under(exchange_dir) == set()


async def test_late_commit_failed_while_the_quarantine_move_is_pending_keeps_the_messages(app, client, disk, exchange_dir):
    ids, pid = await started(client, 2)
    await client.post(f"{PR}/{pid}/ready")
    disk.fail("_replace")
    await recover(app.state.context)
    disk.heal()
    response = await client.post(f"{PR}/{pid}/commit-failed")
    assert response.json()["state"] == "ABORTED"
    await recover(app.state.context)
    assert files_under(exchange_dir) == {f"mailboxes/mobile-a/db-1/{i}" for i in ids}
    assert [m["id"] for m in (await listed(client))["messages"]] == ids


async def test_a_move_recorded_for_the_decision_before_the_quarantine_leaves_the_quarantine_pending(app, client, store):
    """Each decision about a message's file bumps its version: a server that moved the file for the decision
    before (the mailbox) and records it once the process went IN_DOUBT must not mark the quarantine's move done."""
    ids, pid = await started(client, 1)
    async with store.read() as conn:
        before = (await conn.execute(select(M).where(M.c.id == ids[0]))).one()
    await client.post(f"{PR}/{pid}/ready")
    async with store.transaction() as tx:
        await data.put_in_doubt(tx, [pid], store.now_ms())
    async with store.transaction() as tx:
        await record_file_moves(app.state.context, tx, [Outcome(MessageRow(*before), done=True)], store.now_ms())
    async with store.read() as conn:
        after = (await conn.execute(select(M.c.state, M.c.path, M.c.synced).where(M.c.id == ids[0]))).one()
    assert tuple(after) == ("QUARANTINED", f"unknown/{pid}/{ids[0]}", False)


async def test_a_move_recorded_for_an_older_decision_leaves_the_commit_pending(app, client, store):
    """A message quarantined by one process, given back, then committed by the next: the late record of the
    quarantine's move (two decisions ago) must not mark the commit's delete done."""
    ids, first = await started(client, 1)
    await client.post(f"{PR}/{first}/ready")
    async with store.transaction() as tx:
        await data.put_in_doubt(tx, [first], store.now_ms())
    async with store.read() as conn:
        quarantined = (await conn.execute(select(M).where(M.c.id == ids[0]))).one()
    resolved = await client.post(f"{PR}/{first}/resolve", json={"committed": False})
    assert resolved.status_code == 200, resolved.text
    second = (await start(client, ids)).json()["id"]
    await client.post(f"{PR}/{second}/ready")
    async with store.transaction() as tx:
        await data.commit_process_messages(tx, second, False, store.now_ms())
    async with store.transaction() as tx:
        await record_file_moves(app.state.context, tx, [Outcome(MessageRow(*quarantined), done=True)], store.now_ms())
    async with store.read() as conn:
        after = (await conn.execute(select(M.c.state, M.c.synced).where(M.c.id == ids[0]))).one()
    assert tuple(after) == ("COMMITTED", False)


async def test_recording_the_same_file_moves_twice_at_once_never_deadlocks(app, client, store):
    """Recovery, the watchdog and a process's own cleanup (on any server) may record overlapping file moves
    at once, each from its own query order (a full-suite run met a PostgreSQL deadlock between two of them)."""
    ids = [(await put(client, f"body-{i}".encode()))["id"] for i in range(80)]
    async with store.read() as conn:
        rows = (await conn.execute(select(M).where(M.c.id.in_(ids)))).all()
    forward = [Outcome(row, done=True) for row in sorted(rows, key=lambda r: r.id)]

    async def record(outcomes):
        async with store.transaction() as tx:
            await record_file_moves(app.state.context, tx, outcomes, store.now_ms())

    for _ in range(5):
        await asyncio.gather(record(forward), record(forward[::-1]), record(forward[40:] + forward[:40]))
    async with store.read() as conn:
        assert all(r.synced for r in (await conn.execute(select(M.c.synced).where(M.c.id.in_(ids)))).all())


def test_a_move_another_server_makes_while_we_look_is_not_a_missing_file(tmp_path, monkeypatch):
    """The race behind a false ``exchange_message_file_missing``: we find the target empty, another server (or
    recovery beside the watchdog) moves the file there, then we find the source empty too."""
    from mainspring.exchange import files

    disk = files.Disk(tmp_path)
    source, target = "mailboxes/mobile-a/db-1/m1", "unknown/p1/m1"
    disk.write_atomic(source, b"body")
    looked_up = disk.full
    moved = []

    def full_while_another_server_moves(relative):
        path = looked_up(relative)
        if relative == source and not moved:
            moved.append(relative)  # the other server's move, just before we look at the source
            looked_up(target).parent.mkdir(parents=True)
            os.replace(path, looked_up(target))
        return path

    monkeypatch.setattr(disk, "full", full_while_another_server_moves)
    assert disk.place(target, [source]) is True
    assert files_under(tmp_path) == {target}


async def test_a_missing_file_is_not_alerted_when_a_newer_decision_came_meanwhile(app, client, store):
    ids = [(await put(client, f"body-{i}".encode()))["id"] for i in range(2)]
    async with store.read() as conn:
        stale, current = sorted((await conn.execute(select(M).where(M.c.id.in_(ids)))).all(), key=lambda r: r.id)
    async with store.transaction() as tx:  # another server decided anew about ``stale`` while we looked
        await tx.execute(M.update().where(M.c.id == stale.id).values(file_version=M.c.file_version + 1))
        await record_file_moves(app.state.context, tx, [Outcome(stale, done=True, missing=True),
                                                        Outcome(current, done=True, missing=True)], store.now_ms())
    assert [a.subject_id for a in await open_alerts(store, "exchange_message_file_missing")] == [current.id]


async def test_a_server_killed_after_committing_before_its_files_went_loses_nothing(settings, store, exchange_dir, monkeypatch):
    """API_4 records the commit, then deletes the files, then answers DONE. A server that dies in between (here:
    the deletes never start, and no background loop runs) shows nothing wrongly, and the next start finishes
    the cleanup."""
    from mainspring.exchange import service as exchange_service

    class Killed(BaseException):
        pass

    async def killed(*_args, **_kwargs):
        raise Killed

    app = create_app(settings, store=store, run_background=False)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://mainspring.test"
    ) as client:
        ids, pid = await started(client, 2)
        reply = {"replies": [{"addressee": "mobile-b", "database": "db-1", "body": "receipt"}]}
        assert (await client.post(f"{PR}/{pid}/ready", json=reply)).status_code == 200
        with monkeypatch.context() as patched:
            patched.setattr(exchange_service.sync, "clean_up_committed", killed)
            try:
                await exchange_service.committed(app.state.context, pid)
            except Killed:
                pass
            else:
                raise AssertionError("the deletes were not reached")

        # Killed here: the files are still on disk, and nothing shows them; the reply is published.
        assert files_under(exchange_dir / "mailboxes" / "mobile-a") == {f"db-1/{i}" for i in ids}
        assert (await listed(client))["messages"] == []
        for message_id in ids:
            assert (await client.get(f"{MAILBOX}/messages/{message_id}")).status_code == 404
        assert len((await listed(client, "/v1/exchange/mailboxes/mobile-b/db-1"))["messages"]) == 1
        assert (await process(client, pid))["state"] == "CLEANUP"
        assert (await client.post(f"{PR}/{pid}/commit-failed")).json()["code"] == "already_committed"

        await recover(app.state.context)  # what the next start runs first
        assert (await process(client, pid))["state"] == "DONE"
        assert files_under(exchange_dir / "mailboxes" / "mobile-a") == set()
        types = await event_types(store, pid)
        assert types.count("exchange.process.committed") == 1 and types.count("exchange.process.done") == 1


async def test_a_failed_move_is_retried_a_delay_after_its_attempt_not_after_it_was_recorded(app, client, store):
    """A batch's failures may be recorded long after the attempt (the disk work ran meanwhile, and the clock
    moved): the retry is due ``cleanup_retry_ms`` after the attempt."""
    message = await put(client, b"in")
    async with store.read() as conn:
        row = (await conn.execute(select(M).where(M.c.id == message["id"]))).one()
    attempted_at = store.now_ms() - 60_000
    async with store.transaction() as tx:
        await record_file_moves(app.state.context, tx, [Outcome(MessageRow(*row), done=False, error="EIO")], attempted_at)
    async with store.read() as conn:
        retry_at = (await conn.execute(select(M.c.next_sync_at).where(M.c.id == message["id"]))).scalar()
    assert retry_at == attempted_at + app.state.context.settings.exchange.cleanup_retry_ms

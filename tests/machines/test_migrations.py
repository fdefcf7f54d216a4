"""machines_0002 gives machines the one lease shape without losing a row of what machines_0001 stored."""

from __future__ import annotations

from sqlalchemy import text

from mainspring.store import Store
from mainspring.store.migrate import migrate
from tests.conftest import upgrade_to


async def test_the_lease_shape_migration_keeps_machines_their_history_and_their_lease(blank_database_url: str) -> None:
    store = Store(blank_database_url)
    try:
        await store.run_sync(upgrade_to("machines_0001"))
        async with store.transaction() as tx:
            await tx.execute(text(
                "INSERT INTO machines (uid, namespace, id, status, version, last_event_id, retry_attempt, lease_token, lease_until, created_at, updated_at) "
                "VALUES (1, 'orders', 'm1', 'working', 3, 2, 0, 'token-of-forty-chars-at-most', 1234, 1, 2)"
            ))
            await tx.execute(text("INSERT INTO machine_history (machine_uid, event_id, created_at, data) VALUES (1, 1, 1, '\"a\"'), (1, 2, 2, '\"b\"')"))
            await tx.execute(text(
                "INSERT INTO machine_notifications (id, machine_uid, args, created_at, due_at, attempts) VALUES ('n1', 1, '1', 1, 1, 0)"
            ))
        await migrate(store)
        async with store.read() as conn:
            machine = (await conn.execute(text("SELECT lease_token, lease_expires_at FROM machines WHERE uid = 1"))).one()
            events = (await conn.execute(text("SELECT count(*) FROM machine_history WHERE machine_uid = 1"))).scalar_one()
            pending = (await conn.execute(text("SELECT count(*) FROM machine_notifications WHERE machine_uid = 1"))).scalar_one()
        assert tuple(machine) == ("token-of-forty-chars-at-most", 1234)
        assert (events, pending) == (2, 1)
        async with store.transaction() as tx:  # a 64-character token fits now
            await tx.execute(text("UPDATE machines SET lease_token = :t WHERE uid = 1"), {"t": "x" * 64})
    finally:
        await store.close()

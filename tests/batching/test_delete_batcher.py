"""``DELETE /v1/batchers/{name}``: a batcher goes with its tasks, packages and version log, in one go."""

from __future__ import annotations

from sqlalchemy import func, select

from mainspring.batching import service
from mainspring.batching.tables import batch_packages, batch_tasks, batch_versions, batchers
from mainspring.store import Store
from tests.batching.conftest import claim, put_batcher, submit, submit_pair, wait_status


async def rows_of(store: Store, name: str) -> dict[str, int]:
    async with store.read() as conn:
        counts = {}
        for table, column in ((batchers, batchers.c.name), (batch_tasks, batch_tasks.c.batcher),
                              (batch_versions, batch_versions.c.batcher), (batch_packages, batch_packages.c.batcher)):
            counts[table.name] = (await conn.execute(select(func.count()).select_from(table).where(column == name))).scalar()
    return counts


async def packed_pair(client, name: str, book: str = "79") -> list[str]:
    await put_batcher(client, name, max_size=2)
    ids = await submit_pair(client, book, name=name)
    await wait_status(client, ids, "packed", name=name)
    return ids


async def test_delete_removes_exactly_that_batchers_rows_and_emits_an_event(client, store, batch_events) -> None:
    await packed_pair(client, "books")
    await packed_pair(client, "films")
    assert (await rows_of(store, "books")) == {"batchers": 1, "batch_tasks": 2, "batch_versions": 2, "batch_packages": 1}
    untouched = await rows_of(store, "films")

    response = await client.delete("/v1/batchers/books")
    assert response.status_code == 204, response.text
    assert response.content == b""
    assert set((await rows_of(store, "books")).values()) == {0}
    assert await rows_of(store, "films") == untouched
    assert (await client.get("/v1/batchers/books")).json()["code"] == "batcher_not_found"
    assert (await client.get("/v1/batchers/films")).status_code == 200

    removed = await batch_events("batch.batcher.removed")
    assert [(e["subject"]["id"], e["data"]["tasks"], e["data"]["packages"], e["data"]["versions"]) for e in removed] == [
        ("books", 2, 1, 2)
    ]


async def test_an_unknown_batcher_is_a_404(client) -> None:
    response = await client.delete("/v1/batchers/nope")
    assert response.status_code == 404
    assert response.json()["code"] == "batcher_not_found"


async def test_a_claimed_package_refuses_the_delete_with_409_until_forced_or_expired(client, store, clock) -> None:
    await packed_pair(client, "books")
    package = await claim(client, lease_ms=1000)
    assert package is not None
    busy = await client.delete("/v1/batchers/books")
    assert busy.status_code == 409
    assert busy.json()["code"] == "batcher_busy" and busy.json()["claimed"] == 1
    assert (await rows_of(store, "books"))["batch_tasks"] == 2  # nothing went

    assert (await client.delete("/v1/batchers/books", params={"force": "true"})).status_code == 204
    assert set((await rows_of(store, "books")).values()) == {0}
    # The worker that held it learns the package is gone.
    late = await client.post(f"/v1/packages/{package['id']}/complete", json={"token": package["lease"]["token"]})
    assert late.status_code == 404 and late.json()["code"] == "package_not_found"


async def test_an_expired_lease_does_not_hold_the_batcher(client, clock) -> None:
    await packed_pair(client, "books")
    assert await claim(client, lease_ms=1000) is not None
    clock.advance(1001)
    assert (await client.delete("/v1/batchers/books")).status_code == 204


async def test_a_submit_after_delete_starts_the_batcher_afresh(client, store) -> None:
    await put_batcher(client, "books", linger_ms=60_000)
    await submit(client, "t1", "79", "en", "first")
    second = await submit(client, "t2", "79", "en", "second")
    assert second["version"] == 2
    assert (await client.delete("/v1/batchers/books")).status_code == 204

    # This server had cached "books" as known: the delete made it forget, so the submit creates it again.
    again = await submit(client, "t1", "79", "en", "second")
    assert (again["status"], again["version"]) == ("pending", 1)
    fresh = (await client.get("/v1/batchers/books")).json()
    assert fresh["linger_ms"] != 60_000  # the API defaults, not the deleted settings
    assert fresh["counts"]["pending"] == 1
    assert (await rows_of(store, "books"))["batch_versions"] == 1


async def test_a_delete_signalled_by_another_server_empties_the_known_batchers(store) -> None:
    known = service.known_batchers(store)
    known.add("books")
    assert "books" in service.known_batchers(store)
    # What the PostgreSQL listener does when another server's delete commits (NOTIFY).
    store.notifier.signal(service.BATCHERS_REMOVED_CHANNEL)
    assert "books" not in service.known_batchers(store)

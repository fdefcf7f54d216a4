"""A store written by the previous release upgrades with its data intact, on both engines: built by the migrations
up to that release's heads (``store.releases``), filled as that schema holds data, migrated, read through the API."""

from __future__ import annotations

import httpx
from sqlalchemy import text

from mainspring.api import create_app
from mainspring.config import Settings
from mainspring.store import Store
from mainspring.store.migrate import migrate, pending_revisions
from mainspring.store.releases import RELEASED_HEADS
from tests.conftest import upgrade_to

PREVIOUS = list(RELEASED_HEADS)[-1]


async def test_a_store_written_by_the_previous_release_upgrades_with_its_interactions_intact(
    blank_database_url: str, settings: Settings
) -> None:
    store = Store(blank_database_url)
    for head in RELEASED_HEADS[PREVIOUS]:
        await store.run_sync(upgrade_to(head))
    assert await pending_revisions(store)  # today's code has migrations the release did not
    now = store.now_ms()
    async with store.transaction() as tx:
        # As the release wrote them: a queue with a rate limit, an item waiting, one completed, one failed.
        await tx.execute(text(
            "INSERT INTO interaction_queues (name, rate_limit_count, rate_limit_per_ms, concurrency, lease_ms, error_delay_ms, "
            "max_attempts, created_at, updated_at) VALUES ('invoices', 5, 1000, 2, 30000, 1000, 7, :now, :now)"), {"now": now})
        for message_id, state, result, error in (("m-waiting", "queued", None, None), ("m-done", "completed", '{"sent": true}', None),
                                                 ("m-failed", "failed", None, "smtp said no")):
            await tx.execute(text(
                "INSERT INTO interactions (queue, message_id, \"user\", data, result, error, state, next_processing, attempts, "
                "created_at, updated_at, finished_at) VALUES ('invoices', :mid, 'ada', :data, :result, :error, :state, :due, :attempts, "
                ":now, :now, :finished)"
            ), {"mid": message_id, "data": f'{{"for": "{message_id}", "amount": 12.5}}', "result": result, "error": error, "state": state,
                "due": now - 1 if state == "queued" else None, "attempts": 0 if state == "queued" else 1, "now": now,
                "finished": None if state == "queued" else now})
    await migrate(store)  # as `mainspring serve` and `mainspring migrate` do before anything else
    assert not await pending_revisions(store)
    await store.close()

    # The new version serves it.
    application = create_app(settings.model_copy(update={"server": settings.server.model_copy(update={"database": blank_database_url})}))
    async with application.router.lifespan_context(application):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://upgrade.test") as client:
            queue = (await client.get("/v1/queues/invoices")).json()
            assert (queue["rate_limit"], queue["concurrency"], queue["max_attempts"]) == ({"count": 5, "per_ms": 1000}, 2, 7)
            assert {k: queue["counts"][k] for k in ("ready", "completed", "failed")} == {"ready": 1, "completed": 1, "failed": 1}
            listed = (await client.get("/v1/queues/invoices/interactions")).json()["interactions"]
            found = {i["message_id"]: i for i in listed}
            assert {m: (i["status"], i["data"], i["user"]) for m, i in found.items()} == {
                "m-waiting": ("ready", {"for": "m-waiting", "amount": 12.5}, "ada"),
                "m-done": ("completed", {"for": "m-done", "amount": 12.5}, "ada"),
                "m-failed": ("failed", {"for": "m-failed", "amount": 12.5}, "ada")}
            assert found["m-done"]["result"] == {"sent": True}
            assert "smtp said no" in str(found["m-failed"]["error"])
            # And it works on: the waiting item is leased and completed by the new version.
            leased = (await client.post("/v1/queues/invoices/lease", json={"worker": "w", "max": 5})).json()["interactions"]
            assert [i["message_id"] for i in leased] == ["m-waiting"]

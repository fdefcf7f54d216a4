"""The processes list (API.md §1 inspect): oldest start first, paged by cursor, with and without a state —
read in the order of its indexes (exchange_0003), the next page strictly after the cursor's (start, id)."""

from __future__ import annotations

from tests.exchange.test_retention import done, started

PR = "/v1/exchange/processes"


async def pages(client, **params) -> list[str]:
    """Every process id the list gives, following ``next_cursor`` two at a time."""
    ids, cursor = [], None
    while True:
        body = (await client.get(PR, params={"limit": 2, **params, **({"cursor": cursor} if cursor else {})})).json()
        ids += [p["id"] for p in body["processes"]]
        cursor = body.get("next_cursor")
        if not cursor:
            return ids


async def test_processes_page_by_cursor_in_start_order_with_and_without_a_state(client, clock) -> None:
    finished, live = [], []
    for i in range(3):
        finished.append((await done(client, f"done-{i}"))[1])
        live.append((await started(client, f"live-{i}"))[1])  # the same start time as the one before it
        clock.advance(10)
    assert await pages(client, state="DONE") == finished
    assert await pages(client, state="STARTED") == live
    everything = await pages(client)
    assert sorted(everything) == sorted(finished + live) and len(set(everything)) == 6
    assert [pid for pid in everything if pid in finished] == finished

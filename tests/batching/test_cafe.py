"""The package cafe: claim (long-poll, exactly one), heartbeat, complete with results, fail, lease expiry."""

from __future__ import annotations

import asyncio
import time

from tests.batching.conftest import claim, put_batcher, statuses, submit_pair, task, wait_status


async def one_package(client, clock, book: str = "79") -> tuple[list[str], str]:
    ids = await submit_pair(client, book)
    clock.advance(5000)
    packed = await wait_status(client, ids, "packed")
    return ids, packed[0]["package_id"]


async def post(client, path: str, body: dict, expect: int = 200) -> dict:
    response = await client.post(path, json=body)
    assert response.status_code == expect, response.text
    return response.json()


async def test_claim_answers_204_after_waiting_when_no_package_waits(client) -> None:
    await put_batcher(client)
    started = time.monotonic()
    response = await client.post("/v1/batchers/books/packages/claim", json={"worker": "w", "wait_ms": 300})
    assert response.status_code == 204
    assert time.monotonic() - started >= 0.28


async def test_a_waiting_claim_gets_the_package_as_soon_as_it_is_made(client, clock) -> None:
    await put_batcher(client)
    ids = await submit_pair(client, "79")
    waiting = asyncio.create_task(claim(client, wait_ms=20_000))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    started = time.monotonic()
    clock.advance(5000)
    package = await asyncio.wait_for(waiting, 10)
    assert package is not None and {t["id"] for t in package["tasks"]} == set(ids)
    assert time.monotonic() - started < 5
    assert package["lease"]["token"] and package["status"] == "claimed" and package["attempts"] == 1


async def test_complete_records_per_task_results_and_errors(client, clock) -> None:
    await put_batcher(client)
    ids, package_id = await one_package(client, clock)
    package = await claim(client)
    token = package["lease"]["token"]
    body = {"token": token, "results": [{"task_id": ids[0], "result": {"pages": 12}},
                                        {"task_id": ids[1], "status": "failed", "error": "bad encoding"}]}
    done = await post(client, f"/v1/packages/{package_id}/complete", body)
    assert done["status"] == "done" and done["lease"] is None
    en, ru = await task(client, ids[0]), await task(client, ids[1])
    assert (en["status"], en["result"]) == ("done", {"pages": 12})
    assert (ru["status"], ru["error"]) == ("failed", "bad encoding")
    # The same completion again is answered the same; another token is not.
    assert (await post(client, f"/v1/packages/{package_id}/complete", body))["status"] == "done"
    lost = await post(client, f"/v1/packages/{package_id}/complete", {"token": "someone-else"}, expect=409)
    assert lost["code"] == "lease_lost"


async def test_results_may_be_a_map_of_task_id_to_result(client, clock) -> None:
    await put_batcher(client)
    ids, package_id = await one_package(client, clock)
    package = await claim(client)
    await post(client, f"/v1/packages/{package_id}/complete",
               {"token": package["lease"]["token"], "results": {ids[0]: "ok-en", ids[1]: "ok-ru"}})
    assert [(await task(client, i))["result"] for i in ids] == ["ok-en", "ok-ru"]


async def test_results_naming_a_foreign_task_are_422_and_change_nothing(client, clock) -> None:
    await put_batcher(client)
    ids, package_id = await one_package(client, clock)
    package = await claim(client)
    bad = await post(client, f"/v1/packages/{package_id}/complete",
                     {"token": package["lease"]["token"], "results": {"not-mine": 1}}, expect=422)
    assert bad["code"] == "invalid_request"
    assert set((await statuses(client, ids)).values()) == {"claimed"}


async def test_fail_with_retry_puts_the_package_back_in_the_cafe(client, clock) -> None:
    await put_batcher(client)
    ids, package_id = await one_package(client, clock)
    first = await claim(client, worker="w1")
    back = await post(client, f"/v1/packages/{package_id}/fail",
                      {"token": first["lease"]["token"], "error": "disk full", "retry": True})
    assert back["status"] == "ready" and back["error"] == "disk full"
    assert set((await statuses(client, ids)).values()) == {"packed"}
    second = await claim(client, worker="w2")
    assert second["id"] == package_id and second["attempts"] == 2 and second["worker"] == "w2"
    stale = await post(client, f"/v1/packages/{package_id}/complete", {"token": first["lease"]["token"]}, expect=409)
    assert stale["code"] == "lease_lost"


async def test_fail_without_retry_fails_the_package_and_its_tasks(client, clock, batch_events) -> None:
    await put_batcher(client)
    ids, package_id = await one_package(client, clock)
    package = await claim(client)
    failed = await post(client, f"/v1/packages/{package_id}/fail",
                        {"token": package["lease"]["token"], "error": "corrupt book", "retry": False})
    assert failed["status"] == "failed"
    for i in ids:
        t = await task(client, i)
        assert (t["status"], t["error"]) == ("failed", "corrupt book")
    assert await claim(client) is None
    kinds = [e["type"] for e in await batch_events("batch.task.failed,batch.package.failed")]
    assert sorted(kinds) == ["batch.package.failed", "batch.task.failed", "batch.task.failed"]


async def test_heartbeat_extends_the_lease_and_an_expired_lease_puts_the_package_back(client, clock) -> None:
    await put_batcher(client)
    ids, package_id = await one_package(client, clock)
    package = await claim(client, worker="slow", lease_ms=1000)
    token = package["lease"]["token"]
    clock.advance(900)
    beat = await post(client, f"/v1/packages/{package_id}/heartbeat", {"token": token})
    assert beat["lease"]["expires_at"] > package["lease"]["expires_at"]
    clock.advance(900)
    assert await claim(client, worker="other") is None  # still held thanks to the heartbeat
    clock.advance(200)
    await wait_status(client, ids, "packed")  # expired: back in the cafe
    retaken = await claim(client, worker="other")
    assert retaken["id"] == package_id and retaken["lease"]["token"] != token
    for action, body in [("heartbeat", {"token": token}), ("complete", {"token": token}),
                         ("fail", {"token": token, "error": "x"})]:
        lost = await post(client, f"/v1/packages/{package_id}/{action}", body, expect=409)
        assert lost["code"] == "lease_lost"
    await post(client, f"/v1/packages/{package_id}/complete", {"token": retaken["lease"]["token"]})
    await wait_status(client, ids, "done")


async def test_twenty_concurrent_claimers_get_each_package_exactly_once(client, clock) -> None:
    await put_batcher(client, max_size=2)
    for book in range(10):
        await submit_pair(client, f"b{book}")
    await wait_status(client, [f"b{i}-en" for i in range(10)], "packed")
    got = await asyncio.gather(*(claim(client, worker=f"w{i}", wait_ms=0) for i in range(20)))
    ids = [p["id"] for p in got if p is not None]
    assert len(ids) == 10 and len(set(ids)) == 10
    assert sum(p is None for p in got) == 10


async def test_unknown_packages_are_404_and_bad_bodies_422(client) -> None:
    for action in ("complete", "fail", "heartbeat"):
        missing = await post(client, f"/v1/packages/pkg_nope/{action}", {"token": "t", "error": "e"} if action == "fail" else {"token": "t"}, expect=404)
        assert missing["code"] == "package_not_found"
    assert (await client.get("/v1/packages/pkg_nope")).json()["code"] == "package_not_found"
    bad = await post(client, "/v1/batchers/books/packages/claim", {"wait_ms": -1, "worker": "w"}, expect=422)
    assert bad["code"] == "invalid_request"
    bad = await post(client, "/v1/batchers/books/packages/claim", {}, expect=422)
    assert bad["code"] == "invalid_request"


async def test_a_package_read_by_id_lists_its_tasks_but_never_the_token(client, clock) -> None:
    await put_batcher(client)
    ids, package_id = await one_package(client, clock)
    await claim(client)
    read = (await client.get(f"/v1/packages/{package_id}")).json()
    assert read["lease"] is None and [t["id"] for t in read["tasks"]] == ids
    listed = (await client.get("/v1/batchers/books/packages", params={"status": "claimed"})).json()
    assert [p["id"] for p in listed["packages"]] == [package_id] and listed["next_cursor"] is None


async def test_packages_are_listed_page_by_page_each_once(client, clock) -> None:
    await put_batcher(client, max_size=2)
    for book in range(3):
        await submit_pair(client, f"b{book}")
    await wait_status(client, [f"b{i}-en" for i in range(3)], "packed")
    seen: list[str] = []
    params: dict = {"limit": 2}
    while True:
        page = (await client.get("/v1/batchers/books/packages", params=params)).json()
        seen += [p["id"] for p in page["packages"]]
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert len(seen) == 3 and len(set(seen)) == 3

"""Both books of a pair without a scan: ``GET /v1/batchers/{name}/versions/{group}``."""

from __future__ import annotations

import httpx

from tests.batching.conftest import put_batcher, submit, submit_pair, wait_status


async def test_group_versions_answer_every_member_of_a_group_in_one_call(client, clock) -> None:
    await put_batcher(client)
    await submit_pair(client, "79")
    clock.advance(5000)
    await wait_status(client, ["79-en", "79-ru"], "packed")
    await submit(client, "79-en-2", "79", "en", "second edition")
    answer = await client.get("/v1/batchers/books/versions/79")
    assert answer.status_code == 200
    members = answer.json()["members"]
    assert {m: [(v["version"], v["task_id"]) for v in lines] for m, lines in members.items()} == {
        "en": [(1, "79-en"), (2, "79-en-2")], "ru": [(1, "79-ru")]}
    assert members["en"] == (await client.get("/v1/batchers/books/versions/79/en")).json()["versions"]
    empty = await client.get("/v1/batchers/books/versions/nothing-here")
    assert empty.status_code == 200 and empty.json() == {"members": {}}


async def test_group_versions_of_an_unknown_batcher_are_404_batcher_not_found(client) -> None:
    answer = await client.get("/v1/batchers/nobody/versions/79")
    assert answer.status_code == 404 and answer.json()["code"] == "batcher_not_found"
    bad = await client.get("/v1/batchers/books/versions/..")
    assert bad.status_code in (404, 422)


async def test_the_client_reads_group_versions(app, clock) -> None:
    from mainspring.client import AsyncBatchingClient

    async with AsyncBatchingClient("http://mainspring.test", transport=httpx.ASGITransport(app=app)) as batching:
        await batching.submit("books", id="79-en", group="79", member="en", content="en")
        await batching.submit("books", id="79-ru", group="79", member="ru", content="ru")
        members = await batching.group_versions("books", "79")
        assert sorted(members) == ["en", "ru"] and members["ru"][0]["task_id"] == "79-ru"

"""Submitting tasks: idempotent ids, duplicate content, versions that keep a pair together, validation."""

from __future__ import annotations

import pytest

from tests.batching.conftest import put_batcher, submit, submit_pair, task, wait_status


async def test_a_new_task_is_accepted_pending_with_202(client, batch_events) -> None:
    await put_batcher(client)
    created = await submit(client, "t1", "79", "en", "hello", expect=202)
    assert created["status"] == "pending" and created["version"] == 1 and created["reason"] is None
    assert created["batcher"] == "books" and len(created["sha256"]) == 64
    accepted = [e for e in await batch_events("batch.task.accepted") if e["subject"]["id"] == "books/t1"]
    assert len(accepted) == 1 and accepted[0]["data"]["version"] == 1


async def test_a_known_id_with_the_same_content_answers_200_with_the_same_task(client, batch_events) -> None:
    await put_batcher(client)
    first = await submit(client, "t1", "79", "en", "hello")
    again = await submit(client, "t1", "79", "en", "hello", expect=200)
    assert again == first
    assert len(await batch_events("batch.task.accepted")) == 1


async def test_a_known_id_with_other_content_is_a_409_task_id_conflict(client) -> None:
    await put_batcher(client)
    await submit(client, "t1", "79", "en", "hello")
    response = await client.post("/v1/batchers/books/tasks", json={"id": "t1", "group": "79", "member": "en", "content": "other"})
    assert response.status_code == 409
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "task_id_conflict"
    assert (await task(client, "t1"))["sha256"] != ""


async def test_the_same_content_again_is_rejected_as_duplicate_with_200_and_an_event(client, batch_events) -> None:
    await put_batcher(client)
    first = await submit(client, "t1", "79", "en", "the same book")
    dup = await submit(client, "t2", "79", "en", "the same book", expect=200)
    assert (dup["status"], dup["reason"], dup["version"]) == ("rejected", "duplicate", first["version"])
    assert (await task(client, "t2"))["status"] == "rejected"
    rejected = await batch_events("batch.task.rejected")
    assert [(e["subject"]["id"], e["data"]["reason"]) for e in rejected] == [("books/t2", "duplicate")]
    # The same content for another member or group is not a duplicate.
    assert (await submit(client, "t3", "79", "ru", "the same book"))["status"] == "pending"
    assert (await submit(client, "t4", "80", "en", "the same book"))["status"] == "pending"


async def test_json_content_is_hashed_canonically(client) -> None:
    await put_batcher(client)
    await submit(client, "t1", "79", "en", {"a": 1, "b": [1, 2]})
    dup = await submit(client, "t2", "79", "en", {"b": [1, 2], "a": 1}, expect=200)
    assert dup["reason"] == "duplicate"


async def test_both_members_of_a_changed_pair_get_the_same_next_version(client, clock) -> None:
    await put_batcher(client)
    await submit_pair(client, "79", content="first edition")
    clock.advance(5000)
    await wait_status(client, ["79-en", "79-ru"], "packed")
    en = await submit(client, "79-en-2", "79", "en", "second edition en")
    ru = await submit(client, "79-ru-2", "79", "ru", "second edition ru")
    assert (en["version"], ru["version"]) == (2, 2)
    # A member that joins the group later starts at the group's version, not at 1.
    de = await submit(client, "79-de", "79", "de", "German")
    assert de["version"] == 2
    log = (await client.get("/v1/batchers/books/versions/79/en")).json()
    assert [(v["version"], v["task_id"]) for v in log["versions"]] == [(1, "79-en"), (2, "79-en-2")]
    assert log["next_cursor"] is None
    assert all(len(v["sha256"]) == 64 and v["at"].endswith("Z") for v in log["versions"])


async def test_a_member_changed_alone_gets_its_next_version(client, clock) -> None:
    await put_batcher(client)
    await submit_pair(client, "79")
    en = await submit(client, "79-en-2", "79", "en", "new en")
    assert en["version"] == 2
    ru_dup = await submit(client, "79-ru-again", "79", "ru", "79 in ru ", expect=200)
    assert (ru_dup["status"], ru_dup["reason"], ru_dup["version"]) == ("rejected", "duplicate", 1)


async def test_the_version_log_pages_with_a_cursor(client) -> None:
    await put_batcher(client)
    for i in range(5):
        await submit(client, f"t{i}", "g", "m", f"edition {i}")
    page = (await client.get("/v1/batchers/books/versions/g/m", params={"limit": 2})).json()
    assert [v["version"] for v in page["versions"]] == [1, 2]
    page2 = (await client.get("/v1/batchers/books/versions/g/m", params={"limit": 2, "cursor": page["next_cursor"]})).json()
    assert [v["version"] for v in page2["versions"]] == [3, 4]
    # Every cursor the pattern allows is a place: one past the largest version is after all of them.
    past = await client.get("/v1/batchers/books/versions/g/m", params={"cursor": "2885194674"})
    assert past.status_code == 200 and past.json()["versions"] == []
    bad = await client.get("/v1/batchers/books/versions/g/m", params={"cursor": "not-a-cursor"})
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_request"
    empty = await client.get("/v1/batchers/books/versions/g/nobody")
    assert empty.status_code == 200 and empty.json()["versions"] == []


async def test_an_unknown_task_is_404_task_not_found(client) -> None:
    await put_batcher(client)
    response = await client.get("/v1/batchers/books/tasks/nope")
    assert response.status_code == 404 and response.json()["code"] == "task_not_found"


@pytest.mark.parametrize(
    "body",
    [
        {"group": "g", "member": "m", "content": "x"},
        {"id": "a/b", "group": "g", "member": "m", "content": "x"},
        {"id": "t", "group": "..", "member": "m", "content": "x"},
        {"id": "t", "group": "g", "member": "m"},
        {"id": "t", "group": "g", "member": "m", "content": "nul\u0000"},
        {"id": "t", "group": "g", "member": "m", "content": "x", "extra": 1},
        [],
    ],
)
async def test_bad_task_bodies_are_422_and_change_nothing(client, body) -> None:
    response = await client.post("/v1/batchers/books/tasks", json=body)
    assert response.status_code == 422 and response.json()["code"] == "invalid_request"
    assert (await client.get("/v1/batchers/books")).status_code == 404


async def test_a_malformed_json_body_is_422(client) -> None:
    response = await client.post("/v1/batchers/books/tasks", content=b"{nope", headers={"content-type": "application/json"})
    assert response.status_code == 422


async def test_a_bad_batcher_name_is_422(client) -> None:
    response = await client.post("/v1/batchers/-bad/tasks", json={"id": "t", "group": "g", "member": "m", "content": "x"})
    assert response.status_code == 422


async def test_batcher_settings_are_stored_and_answered_with_counts(client) -> None:
    created = await put_batcher(client, linger_ms=1234)
    assert created["linger_ms"] == 1234 and created["counts"]["pending"] == 0
    changed = (await client.put("/v1/batchers/books", json={"max_size": 8})).json()
    assert (changed["max_size"], changed["linger_ms"]) == (8, 1234)
    await submit(client, "t1", "g", "m")
    got = (await client.get("/v1/batchers/books")).json()
    assert got["counts"]["pending"] == 1 and got["package_counts"]["ready"] == 0


@pytest.mark.parametrize(
    "body",
    [{"min_size": 0}, {"linger_ms": -1}, {"incomplete_group": "drop"}, {"lease_ms": 0}, {"unknown": 1}],
)
async def test_invalid_batcher_settings_are_422_and_change_nothing(client, body) -> None:
    await put_batcher(client)
    response = await client.put("/v1/batchers/books", json=body)
    assert response.status_code == 422 and response.json()["code"] == "invalid_request"
    assert (await client.get("/v1/batchers/books")).json()["max_size"] == 6


@pytest.mark.parametrize("body", [{"min_size": 7, "max_size": 6}, {"group_size": 9}, {"max_size": 1}])
async def test_settings_contradicting_the_stored_ones_are_409_batcher_settings_conflict_and_change_nothing(client, body) -> None:
    # Whether a valid body fits depends on what is stored (max_size 6 here), which no schema can say: a 409.
    await put_batcher(client)
    response = await client.put("/v1/batchers/books", json=body)
    assert response.status_code == 409 and response.json()["code"] == "batcher_settings_conflict"
    assert (await client.get("/v1/batchers/books")).json()["max_size"] == 6


async def test_an_unknown_batcher_is_404_and_a_submit_creates_it_with_defaults(client) -> None:
    missing = await client.get("/v1/batchers/newbie")
    assert missing.status_code == 404 and missing.json()["code"] == "batcher_not_found"
    await submit(client, "t1", "g", "m", name="newbie")
    got = (await client.get("/v1/batchers/newbie")).json()
    assert (got["min_size"], got["max_size"], got["linger_ms"], got["group_size"]) == (2, 6, 5000, 2)


async def test_concurrent_submits_share_commits_yet_number_versions_and_refuse_conflicts_alone(client) -> None:
    import asyncio

    await put_batcher(client)
    await submit(client, "taken", "9", "en", "first")
    bodies = [{"id": f"e{i}", "group": "7", "member": "en", "content": f"english {i}"} for i in range(5)]
    bodies += [{"id": f"g{i}", "group": f"g{i}", "member": "ru", "content": "книга"} for i in range(5)]
    bodies.append({"id": "taken", "group": "9", "member": "en", "content": "other bytes"})
    answers = await asyncio.gather(*(client.post("/v1/batchers/books/tasks", json=b) for b in bodies))
    assert [a.status_code for a in answers] == [202] * 10 + [409]
    # One member's five new contents got five distinct, consecutive versions, whatever the commits shared.
    assert sorted(a.json()["version"] for a in answers[:5]) == [1, 2, 3, 4, 5]
    assert all(a.json()["version"] == 1 for a in answers[5:10])


async def test_concurrent_submits_of_pairs_in_any_order_number_each_group_in_step(client) -> None:
    import asyncio
    import random

    await put_batcher(client)
    bodies = [{"id": f"{g}-{m}-{v}", "group": g, "member": m, "content": f"{g} {m} {v}"}
              for v in range(3) for g in ("a", "b", "c", "d") for m in ("en", "ru")]
    random.Random(7).shuffle(bodies)
    answers = await asyncio.gather(*(client.post("/v1/batchers/books/tasks", json=b) for b in bodies))
    assert {a.status_code for a in answers} == {202}
    for group in ("a", "b", "c", "d"):
        versions = (await client.get(f"/v1/batchers/books/versions/{group}")).json()["members"]
        # Each member's three contents got three distinct numbers, and the pair's numbers stayed aligned.
        assert len({v["version"] for v in versions["en"]}) == 3 and len({v["version"] for v in versions["ru"]}) == 3

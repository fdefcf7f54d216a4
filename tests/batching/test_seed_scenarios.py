"""The seed's three integration scenarios, with the ManualClock instead of 5-second sleeps."""

from __future__ import annotations

from tests.batching.conftest import (
    claim,
    eventually,
    put_batcher,
    settle,
    statuses,
    submit,
    submit_pair,
    task,
    wait_status,
)


async def test_a_pair_of_books_goes_through_the_whole_chain(client, clock, batch_events) -> None:
    await put_batcher(client)
    ids = await submit_pair(client, "79")
    assert await statuses(client, ids) == {i: "pending" for i in ids}

    async def timer_started() -> dict | None:
        batcher = (await client.get("/v1/batchers/books")).json()
        return batcher if batcher["linger_ends_at"] else None

    # Two tasks reached min_size: the linger timer runs from the second one's arrival, and is stored.
    batcher = await eventually(timer_started, what="the linger timer")
    assert batcher["linger_started_at"] == (await task(client, ids[1]))["created_at"]

    clock.advance(4999)
    await settle()
    assert set((await statuses(client, ids)).values()) == {"pending"}

    clock.advance(1)
    packed = await wait_status(client, ids, "packed")
    assert packed[0]["package_id"] == packed[1]["package_id"]
    assert [t["version"] for t in packed] == [1, 1]

    package = await claim(client, worker="back-server-1")
    assert package is not None and package["id"] == packed[0]["package_id"]
    assert sorted(t["member"] for t in package["tasks"]) == ["en", "ru"]
    # The cafe key disappeared: the package is taken, nothing else waits.
    assert await claim(client, worker="back-server-2") is None
    await wait_status(client, ids, "claimed")

    done = await client.post(f"/v1/packages/{package['id']}/complete", json={"token": package["lease"]["token"]})
    assert done.status_code == 200 and done.json()["status"] == "done"
    await wait_status(client, ids, "done")
    kinds = [e["type"] for e in await batch_events("batch.*") if e["subject"]["id"] in ("books/79-en", package["id"])]
    assert kinds == ["batch.task.accepted", "batch.task.packed", "batch.package.created", "batch.package.claimed",
                     "batch.task.done", "batch.package.done"]


async def test_two_pairs_then_two_more_near_the_end_of_the_timer(client, clock, batch_events) -> None:
    await put_batcher(client)
    first = await submit_pair(client, "1") + await submit_pair(client, "2")
    clock.advance(4800)
    later = await submit_pair(client, "3") + await submit_pair(client, "4")

    # Six tasks: packed at once, the three oldest pairs, without waiting for any timer.
    six = await wait_status(client, first + later[:2], "packed")
    assert len({t["package_id"] for t in six}) == 1
    assert set((await statuses(client, later[2:])).values()) == {"pending"}

    # The first timer was stopped by the flush: its end changes nothing for the pair left over.
    clock.advance(200)
    await settle()
    assert set((await statuses(client, later[2:])).values()) == {"pending"}

    # The leftover pair got a timer of its own, from the flush.
    clock.advance(4799)
    await settle()
    assert set((await statuses(client, later[2:])).values()) == {"pending"}
    clock.advance(1)
    last = await wait_status(client, later[2:], "packed")
    assert last[0]["package_id"] == last[1]["package_id"] != six[0]["package_id"]
    created = await batch_events("batch.package.created")
    assert [e["data"]["size"] for e in created] == [6, 2]
    assert [e["data"]["trigger"] for e in created] == ["max_size", "linger"]


async def test_an_odd_third_task_near_the_end_of_the_timer_is_rejected_and_its_sender_told(client, clock, batch_events) -> None:
    await put_batcher(client)
    pair = await submit_pair(client, "79")
    clock.advance(4800)
    odd = await submit(client, "80-en", "80", "en", "a lone English book")
    assert odd["status"] == "pending"

    clock.advance(200)
    packed = await wait_status(client, pair, "packed")
    rejected = (await wait_status(client, ["80-en"], "rejected"))[0]
    assert rejected["reason"] == "incomplete_group" and rejected["package_id"] is None
    package = await claim(client)
    assert package is not None and {t["id"] for t in package["tasks"]} == set(pair)
    assert packed[0]["package_id"] == package["id"]
    told = [e for e in await batch_events("batch.task.rejected") if e["subject"]["id"] == "books/80-en"]
    assert len(told) == 1 and told[0]["data"]["reason"] == "incomplete_group"
    # Rejected before it left the dispatcher, the book may be sent again (with its pair) and is not a duplicate.
    again = await submit(client, "80-en-again", "80", "en", "a lone English book")
    assert again["status"] == "pending"
    assert (await task(client, "80-en")).get("status") == "rejected"


async def test_only_one_book_of_the_pair_changed_the_other_is_reissued_so_the_pair_travels_whole(client, clock, batch_events) -> None:
    # Seed 003: "decide what to do when only one book of the pair matches". The pair went out as version 1;
    # then only the English book changes: the unchanged Russian one is a duplicate, and the dispatcher
    # completes version 2 by reissuing it, so the package holds the whole pair with equal versions.
    await put_batcher(client)
    first = await submit_pair(client, "79")
    clock.advance(5000)
    await wait_status(client, first, "packed")
    package = await claim(client)
    assert package is not None
    await client.post(f"/v1/packages/{package['id']}/complete", json={"token": package["lease"]["token"]})

    en = await submit(client, "79-en-2", "79", "en", "79 in en, second edition")
    assert (en["status"], en["version"]) == ("pending", 2)
    ru = await submit(client, "79-ru-2", "79", "ru", "79 in ru ", expect=200)
    assert (ru["status"], ru["reason"], ru["version"]) == ("rejected", "duplicate", 1)
    clock.advance(30_000)  # max_wait: it would have been rejected incomplete_group before reissue existed
    [packed] = await wait_status(client, ["79-en-2"], "packed")
    reissued = await task(client, "79:ru:v2")
    assert (reissued["status"], reissued["version"], reissued["reissued"], reissued["package_id"]) == (
        "packed", 2, True, packed["package_id"])
    assert reissued["sha256"] == (await task(client, "79-ru"))["sha256"] and packed["reissued"] is False

    second = await claim(client)
    assert second is not None and second["id"] == packed["package_id"]
    assert sorted((t["member"], t["version"], t["reissued"]) for t in second["tasks"]) == [("en", 2, False), ("ru", 2, True)]
    assert [t["content"] for t in second["tasks"] if t["member"] == "ru"] == ["79 in ru "]
    told = [e for e in await batch_events("batch.task.reissued") if e["subject"]["id"] == "books/79:ru:v2"]
    assert len(told) == 1 and told[0]["data"]["reissue_of"] == "79-ru" and told[0]["data"]["version"] == 2
    log = (await client.get("/v1/batchers/books/versions/79/ru")).json()["versions"]
    assert [(v["version"], v["task_id"]) for v in log] == [(1, "79-ru"), (2, "79:ru:v2")]
    # The reissued content is still the same book: sent again, it is a duplicate of its first version.
    again = await submit(client, "79-ru-3", "79", "ru", "79 in ru ", expect=200)
    assert (again["reason"], again["version"]) == ("duplicate", 1)


async def test_a_member_never_accepted_before_still_leaves_the_group_incomplete(client, clock) -> None:
    for mode in ("reject", "carry"):
        name = f"books-{mode}"
        await put_batcher(client, name, incomplete_group=mode)
        await submit(client, "80-en", "80", "en", "a lone English book", name=name)
        clock.advance(30_000)
        [rejected] = await wait_status(client, ["80-en"], "rejected", name=name)
        assert rejected["reason"] == "incomplete_group"


async def test_with_reject_the_linger_end_reissues_and_with_carry_the_group_first_waits_for_its_partner(client, clock) -> None:
    for mode in ("reject", "carry"):
        name = f"pairs-{mode}"
        await put_batcher(client, name, incomplete_group=mode)
        await submit_pair(client, "79", name=name)
        clock.advance(5000)
        await wait_status(client, ["79-en", "79-ru"], "packed", name=name)
        await submit(client, "79-en-2", "79", "en", "changed", name=name)
        await submit(client, "81-en", "81", "en", name=name)
        await submit(client, "81-ru", "81", "ru", name=name)
        clock.advance(5000)  # the linger timer of the three new tasks ends
        await wait_status(client, ["81-en", "81-ru"], "packed", name=name)
        if mode == "carry":
            await settle()
            assert (await task(client, "79-en-2", name))["status"] == "pending"
            # Its partner changes after all: the pair of version 2 is two submitted books, nothing reissued.
            await submit(client, "79-ru-2", "79", "ru", "changed too", name=name)
            clock.advance(5000)
            both = await wait_status(client, ["79-en-2", "79-ru-2"], "packed", name=name)
            assert both[0]["package_id"] == both[1]["package_id"]
            missing = await client.get(f"/v1/batchers/{name}/tasks/79:ru:v2")
            assert missing.status_code == 404
        else:
            [en] = await wait_status(client, ["79-en-2"], "packed", name=name)
            assert (await task(client, "79:ru:v2", name))["package_id"] == en["package_id"]


async def test_a_changed_book_resent_alone_leaves_with_its_partners_reissue_after_linger_not_max_wait(client, clock) -> None:
    # Issue 35 item 9: the changed English book alone never reaches min_size (2), so it used to wait the whole
    # max_wait (30 s) for the reissue of its unchanged partner. Its partner has content to reissue: it waits
    # only linger_ms, the time the Russian book has to change too.
    await put_batcher(client)
    await submit_pair(client, "79")
    clock.advance(5000)
    await wait_status(client, ["79-en", "79-ru"], "packed")
    en = await submit(client, "79-en-2", "79", "en", "79 in en, second edition")
    assert (en["status"], en["version"]) == ("pending", 2)
    clock.advance(4999)
    await settle()
    assert (await task(client, "79-en-2"))["status"] == "pending"  # its partner may still change
    clock.advance(1)
    [packed] = await wait_status(client, ["79-en-2"], "packed", within_s=5)
    reissued = await task(client, "79:ru:v2")
    assert (reissued["version"], reissued["reissued"], reissued["package_id"]) == (2, True, packed["package_id"])


async def test_a_changed_book_whose_partner_was_never_accepted_still_waits_until_max_wait(client, clock) -> None:
    # The linger of a changed book alone completes by reissue only: with nothing to reissue it is kept, and
    # rejected at max_wait as any lone task below min_size.
    await put_batcher(client)
    await submit(client, "80-en", "80", "en", "a lone English book")
    clock.advance(30_000)
    await wait_status(client, ["80-en"], "rejected")
    again = await submit(client, "80-en-2", "80", "en", "a lone English book, second edition")
    assert again["version"] == 2
    clock.advance(5000)
    await settle()
    assert (await task(client, "80-en-2"))["status"] == "pending"
    clock.advance(25_000)
    [rejected] = await wait_status(client, ["80-en-2"], "rejected")
    assert rejected["reason"] == "incomplete_group"

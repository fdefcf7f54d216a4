"""The engine behind the API stays short: a dispatcher round, a claim and a complete cost a fixed number of
statements (on PostgreSQL, round trips) however many packages or tasks they handle, counted here so a change
that adds one per package or per task fails here rather than in a benchmark nobody ran."""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select

from mainspring.batching import cafe
from mainspring.batching.dispatcher import dispatch_batcher
from mainspring.batching.models import BatcherSettingsIn, TaskIn
from mainspring.batching.service import put_batcher, submit_task
from mainspring.batching.tables import batch_packages, batch_tasks
from mainspring.core import outbox
from mainspring.core.errors import LeaseLost
from mainspring.store import ManualClock, Store, format_time


async def _stored_pairs(store: Store, name: str, pairs: int, **settings: object) -> None:
    rules = {"min_size": 2, "max_size": 6, "linger_ms": 5000, "max_wait_ms": 600_000, "group_size": 2, **settings}
    await put_batcher(store, name, BatcherSettingsIn.model_validate(rules))
    for g in range(pairs):
        for member in ("en", "ru"):
            await submit_task(store, name, TaskIn(id=f"{g}-{member}", group=str(g), member=member, content=f"{g} {member}"))


async def _round_trips_of_a_round(store: Store, name: str) -> int:
    before = store.backend.round_trips
    await dispatch_batcher(store, name)
    return store.backend.round_trips - before


async def test_a_dispatcher_round_costs_the_same_statements_for_two_packages_as_for_twenty(store: Store) -> None:
    await _stored_pairs(store, "few", 6)
    await _stored_pairs(store, "many", 60)
    await dispatch_batcher(store, "warm")  # a batcher that does not exist: nothing, but the pool is up
    few = await _round_trips_of_a_round(store, "few")
    many = await _round_trips_of_a_round(store, "many")
    async with store.read() as conn:
        packages = dict((await conn.execute(select(batch_packages.c.batcher, func.count()).group_by(batch_packages.c.batcher))).all())
        pending = (await conn.execute(select(func.count()).where(batch_tasks.c.status == "pending"))).scalar_one()
    assert packages == {"few": 2, "many": 20} and pending == 0
    # One statement each for the packages, the tasks moving into them and the events, whatever their number.
    assert many == few, (few, many)


async def test_a_claim_and_a_complete_cost_the_same_statements_for_two_tasks_as_for_six(store: Store) -> None:
    await _stored_pairs(store, "pairs", 3, max_size=2)
    await _stored_pairs(store, "sixes", 3, max_size=6)
    for name in ("pairs", "sixes"):
        await dispatch_batcher(store, name)

    async def claim_and_complete(name: str) -> tuple[int, int]:
        before = store.backend.round_trips
        package = await cafe.claim_once(store, name, "w1", None)
        assert package is not None
        claimed = store.backend.round_trips
        await cafe.complete_package(store, package["id"], package["lease"]["token"], {t["id"]: {"n": 1} for t in package["tasks"]})
        return claimed - before, store.backend.round_trips - claimed

    await claim_and_complete("pairs")  # warm: prepared statements
    small = await claim_and_complete("pairs")
    large = await claim_and_complete("sixes")
    assert small == large, (small, large)
    if store.is_postgres:
        # claim: one autocommit statement (pick + lease, the tasks, the event, the readers' wake-up);
        # complete: BEGIN, the package locked with its tasks, one statement writing the outcomes, the package
        # and, as its last step, the events (their numbering lock held for the commit only), NOTIFY + COMMIT.
        assert large == (1, 4), large


async def test_complete_answers_the_package_and_its_tasks_as_stored(store: Store) -> None:
    await _stored_pairs(store, "books", 3)
    await dispatch_batcher(store, "books")
    package = await cafe.claim_once(store, "books", "w1", None)
    assert package is not None
    first, second, *_ = (t["id"] for t in package["tasks"])
    answer = await cafe.complete_package(store, package["id"], package["lease"]["token"], [
        {"task_id": first, "status": "failed", "error": "no dictionary"}, {"task_id": second, "result": {"pages": 3}},
    ])
    assert answer == await cafe.get_package(store, package["id"])
    assert [t["status"] for t in answer["tasks"]] == ["failed", "done", "done", "done", "done", "done"]


async def test_a_claim_after_a_lease_expired_says_it_took_the_package_over(store: Store, clock: ManualClock) -> None:
    await _stored_pairs(store, "books", 1, lease_ms=1000, linger_ms=0)
    await dispatch_batcher(store, "books")
    first = await cafe.claim_once(store, "books", "w1", None)
    assert first is not None and first["attempts"] == 1
    assert first["lease"]["expires_at"] == format_time(clock.now_ms() + 1000)  # the batcher's lease_ms
    assert await cafe.claim_once(store, "books", "w2", 500) is None  # held: nobody else gets it
    clock.advance(1001)  # expired, not yet put back by the dispatcher: the next claim takes it over
    second = await cafe.claim_once(store, "books", "w2", 500)
    assert second is not None and second["id"] == first["id"] and second["attempts"] == 2 and second["worker"] == "w2"
    assert second["lease"]["expires_at"] == format_time(clock.now_ms() + 500)  # the claimer's lease_ms
    await outbox.wait_numbered(store)
    claims, _ = await outbox.read_events(store, 0, 100, ["batch.package.claimed"])
    assert [(e["data"]["attempt"], e["data"]["retaken_after_expiry"]) for e in claims] == [(1, False), (2, True)]


def _count_commits(store: Store) -> list[int]:
    """Counts the store's transactions from now on (one committed alone counts too)."""
    commits = [0]
    commit = store.backend.commit

    async def counted(*args: object) -> None:
        commits[0] += 1
        await commit(*args)  # type: ignore[arg-type]

    store.backend.commit = counted  # type: ignore[method-assign]
    return commits


async def test_claims_arriving_together_share_one_commit_and_each_claimer_gets_its_own_package(store: Store) -> None:
    await _stored_pairs(store, "books", 9)  # three packages of six, oldest first
    await dispatch_batcher(store, "books")
    async with store.read() as conn:
        oldest_first = list((await conn.execute(select(batch_packages.c.id).order_by(batch_packages.c.seq))).scalars())
    commits = _count_commits(store)
    before = store.backend.round_trips
    answers = await asyncio.gather(*(cafe.claim_once(store, "books", f"w{i}", 1000 * (i + 1)) for i in range(4)))
    assert commits[0] == 1
    if store.is_postgres:
        assert store.backend.round_trips - before == 1  # the claims, their tasks and events: one statement
    assert [p["id"] if p else None for p in answers] == [*oldest_first, None]  # in arrival order; one too many
    first, second, third, _ = answers
    assert first is not None and second is not None and third is not None
    assert [p["worker"] for p in (first, second, third)] == ["w0", "w1", "w2"]
    assert len({p["lease"]["token"] for p in (first, second, third)}) == 3
    assert third["lease"]["expires_at"] == format_time(store.now_ms() + 3000)  # each claimer's own lease_ms
    assert all(t["status"] == "claimed" for p in (first, second, third) for t in p["tasks"])
    await outbox.wait_numbered(store)
    claims, _ = await outbox.read_events(store, 0, 100, ["batch.package.claimed"])
    assert sorted((e["subject"]["id"], e["data"]["worker"]) for e in claims) == sorted(
        (p["id"], p["worker"]) for p in (first, second, third))


async def test_claims_and_completions_arriving_together_share_one_commit(store: Store) -> None:
    # The claims then share their transaction with the completions (not alone in it): their statement is the
    # one without the events, which are written last with the completions' events.
    await _stored_pairs(store, "books", 12)  # four packages
    await dispatch_batcher(store, "books")
    held = [await cafe.claim_once(store, "books", f"w{i}", None) for i in range(2)]
    commits = _count_commits(store)
    answers = await asyncio.gather(
        *(cafe.complete_package(store, p["id"], p["lease"]["token"], None) for p in held if p is not None),
        *(cafe.claim_once(store, "books", f"v{i}", None) for i in range(2)),
    )
    assert commits[0] == 1, commits  # one commit for all four: none was run again alone
    assert [a["status"] for a in answers] == ["done", "done", "claimed", "claimed"]
    assert all(t["status"] == "claimed" for a in answers[2:] for t in a["tasks"])
    await outbox.wait_numbered(store)
    claims, _ = await outbox.read_events(store, 0, 100, ["batch.package.claimed"])
    assert sorted(e["subject"]["id"] for e in claims) == sorted(p["id"] for p in [*held, *answers[2:]] if p)


async def test_completions_arriving_together_share_one_commit_and_a_refused_one_sinks_none(store: Store) -> None:
    await _stored_pairs(store, "books", 18)  # six packages
    await dispatch_batcher(store, "books")
    claimed = [await cafe.claim_once(store, "books", f"w{i}", None) for i in range(3)]
    assert all(p is not None for p in claimed)
    commits = _count_commits(store)
    first, second, third = claimed
    assert first is not None and second is not None and third is not None
    answers = await asyncio.gather(
        cafe.complete_package(store, first["id"], first["lease"]["token"], None),
        cafe.complete_package(store, second["id"], "not-the-token", None),
        cafe.complete_package(store, third["id"], third["lease"]["token"], None),
        return_exceptions=True,
    )
    assert isinstance(answers[1], LeaseLost)
    assert [answers[0]["status"], answers[2]["status"]] == ["done", "done"]  # type: ignore[index]
    assert (await cafe.get_package(store, second["id"]))["status"] == "claimed"
    assert commits[0] == 1, commits  # the refused one changed nothing and the other two still shared a commit
    more = [await cafe.claim_once(store, "books", f"v{i}", None) for i in range(3)]
    commits[0] = 0
    done = await asyncio.gather(*(cafe.complete_package(store, p["id"], p["lease"]["token"], None) for p in more if p is not None))
    assert [p["status"] for p in done] == ["done"] * 3
    assert commits[0] == 1, commits


async def test_a_completion_repeated_in_one_commit_answers_the_same_and_writes_once(store: Store) -> None:
    await _stored_pairs(store, "books", 3)
    await dispatch_batcher(store, "books")
    package = await cafe.claim_once(store, "books", "w1", None)
    assert package is not None
    token, first_task = package["lease"]["token"], package["tasks"][0]["id"]
    results = [{"task_id": first_task, "status": "failed", "error": "torn page"}]
    once, again, stolen = await asyncio.gather(
        cafe.complete_package(store, package["id"], token, results),
        cafe.complete_package(store, package["id"], token, results),
        cafe.complete_package(store, package["id"], "not-the-token", None),
        return_exceptions=True,
    )
    assert once == again == await cafe.get_package(store, package["id"])
    assert isinstance(stolen, LeaseLost)
    await outbox.wait_numbered(store)
    done, _ = await outbox.read_events(store, 0, 100, ["batch.package.done", "batch.task.failed"])
    assert sorted(e["type"] for e in done) == ["batch.package.done", "batch.task.failed"]


async def test_a_submit_is_one_statement_inside_its_commit_on_postgresql(store: Store) -> None:
    await put_batcher(store, "books", BatcherSettingsIn.model_validate({"group_size": 1}))
    await submit_task(store, "books", TaskIn(id="warm", group="w", member="en", content="warm"))  # prepared statements
    before = store.backend.round_trips
    for i in range(10):
        await submit_task(store, "books", TaskIn(id=f"t{i}", group=f"g{i}", member="en", content=f"text {i}"))
    per_submit = (store.backend.round_trips - before) / 10
    # PostgreSQL: BEGIN, the group's numbering lock, one statement (the known-id check, the log's look, the
    # version line, the task and its event), NOTIFY + COMMIT. SQLite (no round trips): BEGIN IMMEDIATE, the
    # task looked up, the log, the version line, the task, its event, COMMIT.
    assert per_submit <= (4 if store.is_postgres else 7), per_submit


async def test_submits_arriving_together_answer_as_submitted_one_by_one(store: Store) -> None:
    # Groups shared by several submits, a repeated id and a repeated content in one group commit: each submit
    # answers what it would have answered alone, in arrival order.
    await put_batcher(store, "books", BatcherSettingsIn.model_validate({"group_size": 2, "min_size": 100, "max_size": 100}))
    bodies = [
        TaskIn(id="a-en", group="a", member="en", content="A"),
        TaskIn(id="a-ru", group="a", member="ru", content="A ru"),
        TaskIn(id="a-en", group="a", member="en", content="A"),  # the same id again: answered as stored
        TaskIn(id="a-en-2", group="a", member="en", content="A"),  # the same content again: a duplicate
        TaskIn(id="a-en-3", group="a", member="en", content="A2"),  # new content: version 2
        TaskIn(id="b-en", group="b", member="en", content="B"),
    ]
    answers = await asyncio.gather(*(submit_task(store, "books", body) for body in bodies))
    got = [(task["id"], task["status"], task["reason"], task["version"], accepted) for task, accepted in answers]
    assert got == [
        ("a-en", "pending", None, 1, True),
        ("a-ru", "pending", None, 1, True),
        ("a-en", "pending", None, 1, False),
        ("a-en-2", "rejected", "duplicate", 1, False),
        ("a-en-3", "pending", None, 2, True),
        ("b-en", "pending", None, 1, True),
    ]
    await outbox.wait_numbered(store)
    events, _ = await outbox.read_events(store, 0, 100, ["batch.task.accepted", "batch.task.rejected"])
    # One event per stored task (the repeated id wrote nothing); only per subject is their order promised.
    assert sorted((e["subject"]["id"], e["type"], e["data"].get("version")) for e in events) == [
        ("books/a-en", "batch.task.accepted", 1), ("books/a-en-2", "batch.task.rejected", 1),
        ("books/a-en-3", "batch.task.accepted", 2), ("books/a-ru", "batch.task.accepted", 1),
        ("books/b-en", "batch.task.accepted", 1),
    ]
    rejected = next(e for e in events if e["type"] == "batch.task.rejected")
    assert rejected["data"] == {"batcher": "books", "id": "a-en-2", "group": "a", "member": "en", "reason": "duplicate",
                                 "version": 1, "sha256": answers[3][0]["sha256"]}


async def test_a_completions_events_are_numbered_in_order_after_the_claims_and_carry_what_the_package_did(store: Store) -> None:
    await _stored_pairs(store, "books", 1, max_size=2)
    await dispatch_batcher(store, "books")
    package = await cafe.claim_once(store, "books", "w1", None)
    assert package is not None
    first, second = (t["id"] for t in package["tasks"])
    await cafe.complete_package(store, package["id"], package["lease"]["token"],
                                [{"task_id": first, "result": {"n": 1}}, {"task_id": second, "status": "failed", "error": "torn page"}])
    await outbox.wait_numbered(store)
    events, _ = await outbox.read_events(store, 0, 100, ["batch.*"])
    kinds = [e["type"] for e in events]
    # Numbered in commit order: the claim's event first, then the completion's in the order it wrote them.
    assert kinds[-4:] == ["batch.package.claimed", "batch.task.done", "batch.task.failed", "batch.package.done"], kinds
    positions = [int(e["id"]) for e in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    done, failed, finished = events[-3:]
    assert done["subject"]["id"].endswith(first) and done["data"] == {"batcher": "books", "id": first, "package_id": package["id"]}
    assert failed["data"] == {"batcher": "books", "id": second, "package_id": package["id"], "error": "torn page"}
    assert finished["subject"]["id"] == package["id"] and finished["data"]["size"] == 2 and finished["data"]["worker"] == "w1"

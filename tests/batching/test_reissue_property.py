"""A property of the dispatcher with reissue, over random sequences of submissions and waits: every accepted
task is packed exactly once (or rejected only when its group could not be completed), and the groups of a
package always hold equal versions of distinct members."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from mainspring.batching.dispatcher import dispatch_batcher
from mainspring.batching.models import BatcherSettingsIn, TaskIn
from mainspring.batching.service import put_batcher, submit_task
from mainspring.batching.tables import batch_packages, batch_tasks, batch_versions
from mainspring.store import ManualClock, Store

_names = itertools.count()

submission = st.tuples(st.just("submit"), st.sampled_from(["g1", "g2"]), st.sampled_from(["en", "ru"]), st.sampled_from("abc"))
wait = st.tuples(st.just("wait"), st.integers(0, 12_000))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.one_of(submission, wait), max_size=24), mode=st.sampled_from(["reject", "carry"]),
       max_size=st.sampled_from([2, 4, 6]))
async def test_accepted_tasks_are_packed_once_and_packages_hold_equal_versions(
    store: Store, clock: ManualClock, steps: list[tuple], mode: str, max_size: int
) -> None:
    name = f"prop-{next(_names)}"  # one database serves every example: each gets a batcher of its own
    await put_batcher(store, name, BatcherSettingsIn(min_size=2, max_size=max_size, linger_ms=5000, max_wait_ms=30_000,
                                                      group_size=2, incomplete_group=mode))
    accepted: set[str] = set()
    for n, step in enumerate(steps):
        if step[0] == "submit":
            _, group, member, content = step
            body = TaskIn(id=f"t{n}", group=group, member=member, content=f"{group} {member} {content}")
            task, new = await submit_task(store, name, body)
            if new:
                accepted.add(task["id"])
        else:
            clock.advance(step[1])
        await dispatch_batcher(store, name)
    for _ in range(3):  # past max_wait: nothing may stay pending
        clock.advance(31_000)
        await dispatch_batcher(store, name)

    async with store.read() as conn:
        tasks = (await conn.execute(select(batch_tasks).where(batch_tasks.c.batcher == name))).all()
        packages = (await conn.execute(select(batch_packages).where(batch_packages.c.batcher == name))).all()
        log = (await conn.execute(select(batch_versions).where(batch_versions.c.batcher == name))).all()
    by_id = {t.id: t for t in tasks}

    # Every accepted task left the dispatcher, into exactly one package or rejected as incomplete.
    assert all(by_id[i].status in ("packed", "rejected") for i in accepted), [(i, by_id[i].status) for i in accepted]
    in_package = Counter(t.package_id for t in tasks if t.package_id is not None)
    assert {p.id: p.size for p in packages} == dict(in_package)
    assert all((by_id[i].package_id is not None) == (by_id[i].status == "packed") for i in accepted)

    # A package's groups are whole: distinct members, one version.
    for package in packages:
        groups: dict[str, list] = defaultdict(list)
        for t in tasks:
            if t.package_id == package.id:
                groups[t.group].append(t)
        for members in groups.values():
            assert len({t.version for t in members}) == 1, [(t.id, t.member, t.version) for t in members]
            assert sorted(t.member for t in members) == ["en", "ru"]

    # Reissued tasks repeat content their member had accepted at an earlier version.
    accepted_lines = [line for line in log if line.withdrawn_at is None]
    for t in tasks:
        if t.reissued:
            assert t.id not in accepted and t.status == "packed"
            assert any(line.member == t.member and line.group == t.group and line.sha256 == t.sha256 and line.version < t.version
                       for line in accepted_lines)

    # Rejected as incomplete only when the partner had nothing accepted before (or holds that version already).
    for i in accepted:
        t = by_id[i]
        if t.status != "rejected":
            continue
        assert t.reason == "incomplete_group"
        partner = "ru" if t.member == "en" else "en"
        earlier = [line for line in accepted_lines if (line.group, line.member) == (t.group, partner) and line.version < t.version
                   and line.task_id in by_id]
        holds = any((line.group, line.member, line.version) == (t.group, partner, t.version) for line in log)
        assert not earlier or holds, (t.id, t.version, earlier)

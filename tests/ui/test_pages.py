"""The dashboard over HTTP (no browser): login, scopes, every page with data, and that each action is
the face's own (same state change, same events) on both engines."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from mainspring.core.tables import events
from mainspring.store import ManualClock, Store
from tests.conftest import eventually
from tests.ui.conftest import (
    NS,
    OrdersProcessor,
    batch_tasks,
    failed_machine,
    in_doubt_process,
    interaction_tree,
    login,
)


async def _event_types(store: Store, subject_id: str) -> list[str]:
    async with store.read() as conn:
        rows = (await conn.execute(select(events.c.type).where(events.c.subject_id == subject_id).order_by(events.c.id))).all()
    return [r.type for r in rows]


async def test_a_page_without_a_token_goes_to_the_login_page(client: httpx.AsyncClient, tokens: dict[str, str]) -> None:
    reply = await client.get("/ui/machines?status=failed")
    assert reply.status_code == 303
    assert reply.headers["location"] == "/ui/login?next=/ui/machines%3Fstatus%3Dfailed"
    page = await client.get("/ui/login")
    assert page.status_code == 200 and 'name="token"' in page.text and "is open" not in page.text


async def test_login_keeps_the_token_in_an_httponly_strict_cookie(client: httpx.AsyncClient, tokens: dict[str, str]) -> None:
    reply = await client.post("/ui/login", data={"token": tokens["admin"], "next": "/ui/exchange"})
    assert reply.status_code == 303 and reply.headers["location"] == "/ui/exchange"
    cookie = reply.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    page = await client.get("/ui/exchange")
    assert page.status_code == 200 and "read-only" not in page.text


async def test_an_unknown_token_or_one_without_ui_scope_cannot_log_in(client: httpx.AsyncClient, tokens: dict[str, str]) -> None:
    bad = await client.post("/ui/login", data={"token": "ms_nope"})
    assert bad.status_code == 401 and "unknown or revoked token" in bad.text
    worker = await client.post("/ui/login", data={"token": tokens["worker"]})
    assert worker.status_code == 403 and "set-cookie" not in worker.headers
    assert (await client.get("/ui/")).status_code == 303


async def test_login_never_redirects_off_the_dashboard(client: httpx.AsyncClient, tokens: dict[str, str]) -> None:
    for target in ("https://evil.example/", "//evil.example/ui", "/v1/alerts", "/ui\\@evil"):
        reply = await client.post("/ui/login", data={"token": tokens["ui"], "next": target})
        assert reply.headers["location"] == "/ui/", target


async def test_with_no_tokens_configured_the_dashboard_is_open_like_the_api(client: httpx.AsyncClient) -> None:
    page = await client.get("/ui/")
    assert page.status_code == 200 and "open server" in page.text
    assert "is open to anyone" in (await client.get("/ui/login")).text


async def test_logout_forgets_the_token(client: httpx.AsyncClient, tokens: dict[str, str]) -> None:
    await login(client, tokens["admin"])
    assert (await client.get("/ui/")).status_code == 200
    await client.post("/ui/logout")
    assert (await client.get("/ui/")).status_code == 303


async def test_read_only_ui_scope_sees_no_actions_and_its_actions_are_refused(
    client: httpx.AsyncClient, tokens: dict[str, str], clock: ManualClock, processor: OrdersProcessor, store: Store
) -> None:
    admin = tokens["admin"]
    pid, _ids = await in_doubt_process(client, clock, admin)
    await failed_machine(client, token=admin)
    parent, _child = await interaction_tree(client, admin)
    await login(client, tokens["ui"])

    exchange = await client.get("/ui/exchange")
    assert exchange.status_code == 200 and pid in exchange.text and "read-only" in exchange.text
    assert "Resolve: committed" not in exchange.text
    machine = await client.get(f"/ui/machines/{NS}/m1")
    assert "failed" in machine.text and "Simple repair" not in machine.text
    overview = await client.get("/ui/")
    assert "in_doubt" in overview.text and ">ack<" not in overview.text

    before = await _event_types(store, pid)
    refused = [
        await client.post(f"/ui/exchange/processes/{pid}/resolve", data={"committed": "false"}),
        await client.post(f"/ui/machines/{NS}/m1/repair", data={"simple": "true"}),
        await client.post(f"/ui/interactions/items/{parent}/cancel"),
        await client.post(f"/ui/interactions/items/{parent}/schedule", data={"in_ms": "5"}),
    ]
    assert [r.status_code for r in refused] == [403, 403, 403, 403]
    assert all("forbidden" in r.text for r in refused)
    assert await _event_types(store, pid) == before
    api = {"Authorization": f"Bearer {admin}"}
    assert (await client.get(f"/v1/exchange/processes/{pid}", headers=api)).json()["state"] == "IN_DOUBT"
    assert (await client.get(f"/v1/namespaces/{NS}/machines/m1", headers=api)).json()["status"] == "failed"
    assert (await client.get(f"/v1/interactions/{parent}", headers=api)).json()["status"] != "cancelled"


async def test_an_action_posted_from_another_site_is_refused(
    client: httpx.AsyncClient, tokens: dict[str, str], processor: OrdersProcessor
) -> None:
    await failed_machine(client, token=tokens["admin"])
    await login(client, tokens["admin"])
    reply = await client.post(f"/ui/machines/{NS}/m1/repair", data={"simple": "true"}, headers={"Origin": "https://evil.example"})
    assert reply.status_code == 403
    machine = await client.get(f"/v1/namespaces/{NS}/machines/m1", headers={"Authorization": f"Bearer {tokens['admin']}"})
    assert machine.json()["status"] == "failed"


async def test_every_page_renders_with_data(client: httpx.AsyncClient, clock: ManualClock, processor: OrdersProcessor) -> None:
    pid, ids = await in_doubt_process(client, clock)
    await client.post("/v1/exchange/mailboxes/mobile-b/db-2/messages", content=b"waiting")
    await failed_machine(client)
    parent, child = await interaction_tree(client)
    await batch_tasks(client)

    pages: dict[str, list[str]] = {
        "/ui/": ["in_doubt", "machine_failed", "<svg", "IN_DOUBT", "failed"],
        "/ui/exchange": [pid, ids[0], "unknown/", "mobile-b"],
        "/ui/exchange?state=IN_DOUBT": [pid],
        "/ui/exchange/mailboxes/mobile-b/db-2": ["Waiting messages (1)"],
        "/ui/machines": ["m1", "failed"],
        f"/ui/machines?ns={NS}&status=failed": ["m1"],
        "/ui/machines?ns=&id=&status=failed": ["m1"],
        "/ui/machines?id=m": ["orders/m1"],
        "/ui/machines?id=zzz": ["no machine matches"],
        "/ui/batching/loads?task=&group=&package_status=": ["loads"],
        f"/ui/machines/{NS}/m1": ["the order book is corrupt", "opened", "Repair", "step"],
        "/ui/interactions": ["mail"],
        "/ui/interactions/queues/mail?status=scheduled": [f">{child}<"],
        f"/ui/interactions/items/{parent}": ["thread", f">{child}<", "Cancel"],
        f"/ui/interactions/items/{child}": [f">{parent}<", "reply"],
        "/ui/batching": ["loads"],
        "/ui/batching/loads?task=t1&group=g1": ["g1/a", "packed", "t2", "Batch forming (1 pending)"],
        "/ui/events": ["exchange.process.in_doubt", "machine.failed", "batch.package.created", 'data-stream="/ui/events/stream"'],
        "/ui/events?types=machine.*": ["machine.failed"],
    }
    for path, expected in pages.items():
        reply = await client.get(path)
        assert reply.status_code == 200, (path, reply.text[:500])
        assert reply.headers["content-type"].startswith("text/html")
        for text in expected:
            assert text in reply.text, (path, text)
    filtered = await client.get("/ui/events?types=machine.*")
    assert "exchange.process.in_doubt" not in filtered.text


async def test_a_batchers_page_shows_the_first_tasks_of_each_package_and_links_to_all_of_them(client: httpx.AsyncClient) -> None:
    from mainspring.ui.pages import TASKS_PER_PACKAGE

    size = TASKS_PER_PACKAGE + 2
    reply = await client.put("/v1/batchers/big", json={"min_size": size, "max_size": size, "linger_ms": 60_000,
                                                       "max_wait_ms": 600_000, "group_size": 1})
    assert reply.status_code == 200, reply.text
    for n in range(size):
        reply = await client.post("/v1/batchers/big/tasks", json={"id": f"task-{n}", "group": f"g{n}", "member": "a", "content": {"n": n}})
        assert reply.status_code in (200, 202), reply.text

    async def packed() -> bool:
        return bool((await client.get("/v1/batchers/big/packages")).json()["packages"])

    await eventually(packed)
    package = (await client.get("/v1/batchers/big/packages")).json()["packages"][0]["id"]
    page = (await client.get("/ui/batching/big")).text
    shown = set(re.findall(r"\?task=(task-\d+)", page))
    assert len(shown) == TASKS_PER_PACKAGE and f"?package={package}" in page and f"all {size} tasks" in page
    whole = (await client.get("/ui/batching/big", params={"package": package})).text
    assert set(re.findall(r"\?task=(task-\d+)", whole)) == {f"task-{n}" for n in range(size)}


async def test_a_package_of_another_batcher_is_not_shown_on_a_batchers_page(client: httpx.AsyncClient) -> None:
    await batch_tasks(client)
    await client.put("/v1/batchers/other", json={"min_size": 2, "max_size": 2, "linger_ms": 60_000, "max_wait_ms": 600_000, "group_size": 2})
    package = (await client.get("/v1/batchers/loads/packages")).json()["packages"][0]["id"]
    page = await client.get("/ui/batching/other", params={"package": package})
    assert page.status_code == 200 and "no package of batcher" in page.text and f"Package <code>{package}" not in page.text


async def test_unknown_things_are_html_error_pages_not_500(client: httpx.AsyncClient, processor: OrdersProcessor) -> None:
    for path, status in (
        (f"/ui/machines/{NS}/nope", 404),
        ("/ui/machines/no-such-ns/x", 404),
        ("/ui/interactions/items/999999", 404),
        ("/ui/batching/nobody", 404),
        ("/ui/exchange?state=BOGUS", 422),
        ("/ui/machines/x/y?after=-1", 422),
        ("/ui/exchange/mailboxes/bad%20name/db", 422),
    ):
        reply = await client.get(path)
        assert reply.status_code == status, path
        assert reply.headers["content-type"].startswith("text/html"), path


async def test_resolve_not_committed_puts_the_messages_back_with_the_apis_events(
    client: httpx.AsyncClient, clock: ManualClock, store: Store
) -> None:
    pid, ids = await in_doubt_process(client, clock)
    reply = await client.post(f"/ui/exchange/processes/{pid}/resolve", data={"committed": "false"})
    assert reply.status_code == 303 and "ABORTED" in reply.headers["location"]
    listed = (await client.get("/v1/exchange/mailboxes/mobile-a/db-1/messages")).json()
    assert [m["id"] for m in listed["messages"]] == ids
    assert (await _event_types(store, pid))[-2:] == ["exchange.process.aborted", "exchange.process.resolved"]
    again = await client.post(f"/ui/exchange/processes/{pid}/resolve", data={"committed": "false"}, follow_redirects=True)
    assert f"not_in_doubt: process {pid} is ABORTED" in again.text


async def test_resolve_committed_deletes_the_messages(client: httpx.AsyncClient, clock: ManualClock) -> None:
    pid, _ids = await in_doubt_process(client, clock)
    page = await client.post(f"/ui/exchange/processes/{pid}/resolve", data={"committed": "true"}, follow_redirects=True)
    assert page.status_code == 200 and f"process {pid} resolved" in page.text
    assert (await client.get("/v1/exchange/mailboxes/mobile-a/db-1/messages")).json()["messages"] == []
    assert (await client.get(f"/v1/exchange/processes/{pid}")).json()["state"] in ("CLEANUP", "DONE")


async def test_repair_and_simple_repair_make_a_failed_machine_work(
    client: httpx.AsyncClient, processor: OrdersProcessor, store: Store
) -> None:
    await failed_machine(client, "m1")
    await failed_machine(client, "m2")
    page = await client.post(f"/ui/machines/{NS}/m1/repair", data={"args": '{"by": "ops"}'}, follow_redirects=True)
    assert "repaired: the machine is working" in page.text
    m1 = (await client.get(f"/v1/namespaces/{NS}/machines/m1")).json()
    assert m1["status"] == "working" and m1["aux_state"] == {"step": 2} and m1["history"][-1]["data"] == {"repaired": {"by": "ops"}}
    await client.post(f"/ui/machines/{NS}/m2/repair", data={"simple": "true"})
    assert (await client.get(f"/v1/namespaces/{NS}/machines/m2")).json()["status"] == "working"
    assert "machine.repaired" in await _event_types(store, f"{NS}/m2")
    twice = await client.post(f"/ui/machines/{NS}/m2/repair", data={"simple": "true"}, follow_redirects=True)
    assert "repair refused" in twice.text
    bad = await client.post(f"/ui/machines/{NS}/m1/repair", data={"args": "{not json"})
    assert bad.status_code == 422


async def test_cancel_and_reschedule_an_interaction(client: httpx.AsyncClient, clock: ManualClock) -> None:
    parent, child = await interaction_tree(client)
    reply = await client.post(f"/ui/interactions/items/{child}/schedule", data={"in_ms": "0"})
    assert reply.status_code == 303
    assert (await client.get(f"/v1/interactions/{child}")).json()["status"] == "ready"
    await client.post(f"/ui/interactions/items/{parent}/cancel")
    assert (await client.get(f"/v1/interactions/{parent}")).json()["status"] == "cancelled"
    # A parent that is cancelled cancels its unfinished children: the service's rule, not the UI's.
    assert (await client.get(f"/v1/interactions/{child}")).json()["status"] == "cancelled"
    finished = await client.post(f"/ui/interactions/items/{parent}/cancel", follow_redirects=True)
    assert "interaction_finished" in finished.text


async def test_a_failed_interaction_shows_a_retry_button_that_makes_it_due_again(client: httpx.AsyncClient) -> None:
    await client.put("/v1/queues/mail", json={"max_attempts": 1})
    item = (await client.post("/v1/queues/mail/interactions", json={"data": 1})).json()
    assert (await client.post(f"/v1/interactions/{item['id']}/fail", json={"error": "smtp said no"})).status_code == 200
    page = await client.get(f"/ui/interactions/items/{item['id']}")
    assert 'data-action="retry"' in page.text
    retried = await client.post(f"/ui/interactions/items/{item['id']}/retry", data={"in_ms": "0"}, follow_redirects=True)
    assert "retried: ready, attempts 0" in retried.text
    again = (await client.get(f"/v1/interactions/{item['id']}")).json()
    assert (again["status"], again["attempts"]) == ("ready", 0)
    assert 'data-action="retry"' not in (await client.get(f"/ui/interactions/items/{item['id']}")).text
    completed = (await client.post("/v1/queues/mail/interactions", json={"data": 2, "completed": True})).json()
    refused = await client.post(f"/ui/interactions/items/{completed['id']}/retry", data={"in_ms": "0"}, follow_redirects=True)
    assert "interaction_finished" in refused.text


async def test_ack_an_alert_from_the_overview(client: httpx.AsyncClient, processor: OrdersProcessor) -> None:
    await failed_machine(client)
    alerts = (await client.get("/v1/alerts", params={"open": "true"})).json()["alerts"]
    assert [a["code"] for a in alerts] == ["machine_failed"]
    page = await client.post(f"/ui/alerts/{alerts[0]['id']}/ack", data={"back": "/ui/"}, follow_redirects=True)
    assert "alert machine_failed acknowledged" in page.text and "Nothing needs a person" in page.text
    assert (await client.get("/v1/alerts", params={"open": "true"})).json()["alerts"] == []


async def test_the_throughput_chart_counts_the_last_hours_events(client: httpx.AsyncClient, clock: ManualClock, app: Any) -> None:
    from mainspring.ui import queries

    for n in range(3):
        await client.post("/v1/queues/mail/interactions", json={"data": n})
    clock.advance(61 * 60_000)
    await client.post("/v1/queues/mail/interactions", json={"data": "late"})
    series = await queries.throughput(app.state.context)
    assert sum(series["interactions"]) == 1 and series["interactions"][-1] == 1
    assert sum(series["machines"]) == 0


async def test_the_throughput_chart_equals_a_count_of_the_events_per_minute(
        client: httpx.AsyncClient, clock: ManualClock, app: Any) -> None:
    from mainspring.ui import queries

    for minute in range(5):
        many = await client.post("/v1/queues/mail/interactions/bulk",
                                 json={"interactions": [{"data": n} for n in range(minute + 1)]})
        one = (await client.post("/v1/queues/mail/interactions", json={"data": "one"})).json()
        await client.post(f"/v1/interactions/{one['id']}/complete", json={})
        assert many.status_code == 201
        clock.advance(60_000)
    series = await queries.throughput(app.state.context, minutes=10)
    now = app.state.context.store.now_ms()
    first = (now // 60_000 - 9) * 60_000
    async with app.state.context.store.read() as conn:
        rows = (await conn.execute(select(events.c.type, events.c.at))).all()
    for face, prefix in queries.FACE_EVENTS.items():
        counted = [0] * 10
        for type_, at in rows:
            if type_.startswith(prefix) and at >= first:
                counted[(at - first) // 60_000] += 1
        assert series[face] == counted, face
    assert sum(series["interactions"]) > 5


async def test_events_retention_prunes_the_minutes_it_has_passed(clock: ManualClock, app: Any, client: httpx.AsyncClient) -> None:
    from mainspring.core import outbox

    await client.post("/v1/queues/mail/interactions", json={"data": 1})
    store = app.state.context.store
    assert await outbox.count_per_minute(store, 0)
    clock.advance(3 * 60_000)
    await client.post("/v1/queues/mail/interactions", json={"data": 2})
    await outbox.delete_events_before(store, store.now_ms() - 60_000)
    assert {minute for minute, _type in await outbox.count_per_minute(store, 0)} == {store.now_ms() // 60_000 * 60_000}


async def test_only_the_shipped_static_files_are_served(client: httpx.AsyncClient) -> None:
    htmx = await client.get("/ui/static/htmx.min.js")
    assert htmx.status_code == 200 and "htmx" in htmx.text[:200]
    assert (await client.get("/ui/static/ui.css")).headers["content-type"].startswith("text/css")
    assert (await client.get("/ui/static/queries.py")).status_code == 404


async def test_the_latency_chart_is_the_mean_time_to_finish_per_minute(client: httpx.AsyncClient, clock: ManualClock, app: Any) -> None:
    from mainspring.ui import queries

    first = (await client.post("/v1/queues/mail/interactions", json={"data": 1})).json()["id"]
    clock.advance(2_000)
    second = (await client.post("/v1/queues/mail/interactions", json={"data": 2})).json()["id"]
    clock.advance(4_000)
    for item in (first, second):
        assert (await client.post(f"/v1/interactions/{item}/complete", json={"result": "ok"})).status_code == 200
    series = await queries.latency(app.state.context)
    assert series["interactions"][-1] == 5_000 and sum(series["interactions"]) == 5_000
    assert sum(series["exchange"]) == 0
    assert "interactions latency: mean ms" in (await client.get("/ui/overview/live")).text


async def test_user_data_is_escaped_in_every_page(client: httpx.AsyncClient) -> None:
    payload = "<script>alert('x')</script>"
    item = (await client.post("/v1/queues/mail/interactions", json={"data": {"note": payload}})).json()["id"]
    page = (await client.get(f"/ui/interactions/items/{item}")).text
    assert payload not in page and "&lt;script&gt;alert(" in page


async def test_a_machines_history_is_paged(client: httpx.AsyncClient, processor: OrdersProcessor) -> None:
    assert (await client.post(f"/v1/namespaces/{NS}/machines", json={"id": "long"})).status_code == 201
    for n in range(24):
        assert (await client.post(f"/v1/namespaces/{NS}/machines/long/call", json={"args": n})).status_code == 200
    newest = (await client.get(f"/ui/machines/{NS}/long")).text
    assert newest.count('{"called": ') == 20 and '{"called": 23}' in newest and '{"called": 3}' not in newest
    assert "direction=backward&after=6" in newest
    older = (await client.get(f"/ui/machines/{NS}/long?direction=backward&after=6")).text
    assert '{"called": 3}' in older and '{"opened": null}' in older and '{"called": 4}' not in older
    assert "next page" not in older


async def test_long_lists_page_through_everything_with_next_links(
    client: httpx.AsyncClient, processor: OrdersProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mainspring.ui import pages

    monkeypatch.setattr(pages, "LIST_PAGE", 2)
    for n in range(5):
        assert (await client.post(f"/v1/namespaces/{NS}/machines", json={"id": f"p{n}"})).status_code == 201
        assert (await client.post("/v1/exchange/mailboxes/mobile-c/db-3/messages", content=f"m{n}".encode())).status_code == 201

    async def walk(path: str, pattern: str) -> list[str]:
        seen: list[str] = []
        for _ in range(10):
            page = await client.get(path)
            assert page.status_code == 200, page.text[:300]
            seen += re.findall(pattern, page.text)
            link = re.search(r'id="next-page" href="(\?[^"]+)"', page.text)
            if link is None:
                return seen
            path = path.split("?", 1)[0] + html.unescape(link.group(1))
        raise AssertionError("the pages never ended")

    assert await walk(f"/ui/machines?ns={NS}", r'data-machine="orders/(p\d)"') == [f"p{n}" for n in range(5)]
    messages = await walk("/ui/exchange/mailboxes/mobile-c/db-3", r'<td><a href="/ui/exchange/messages/m[0-9a-f]+"><code>(m[0-9a-f]+)</code>')
    assert len(messages) == len(set(messages)) == 5
    started = []
    for n in range(3):
        box = f"/v1/exchange/mailboxes/shop-{n}/db"
        stored = (await client.post(f"{box}/messages", content=b"x")).json()["id"]
        process = await client.post(f"{box}/processes", json={"client_id": "erp", "message_ids": [stored]})
        started.append(process.json()["id"])
    assert await walk("/ui/exchange?state=STARTED", r'<tr><td><a href="/ui/exchange/processes/p[0-9a-f]+"><code>(p[0-9a-f]+)</code>') == started
    assert "choose a state to page" in (await client.get("/ui/exchange")).text

"""The dashboard's operator actions over HTTP: bulk retry/cancel and repair, pause/resume, message bodies,
alert links and self-closing alerts, the namespace and process pages — on both engines. Every action goes
through the face's own service, so the API shows the change."""

from __future__ import annotations

import html
import re
from urllib.parse import quote

import httpx
import pytest

from mainspring.app import App, Registration
from mainspring.config import Settings
from mainspring.exchange import files
from mainspring.store import ManualClock
from tests.conftest import eventually
from tests.ui.conftest import MAILBOX, NS, OrdersProcessor, failed_machine, in_doubt_process

FISTFUL_NS = "ff/withdrawal/session_v2"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The dashboard tests' settings, with the alert closer looking every 50 ms."""
    return settings.model_copy(update={"server": settings.server.model_copy(update={"alerts_check_interval_ms": 50})})


async def _failed_items(client: httpx.AsyncClient, queue: str, count: int) -> list[str]:
    ids = []
    for n in range(count):
        item = (await client.post(f"/v1/queues/{queue}/interactions", json={"data": n})).json()
        reply = await client.post(f"/v1/interactions/{item['id']}/fail", json={"error": f"smtp said no #{n}"})
        assert reply.status_code == 200
        ids.append(str(item["id"]))
    return ids


async def _status(client: httpx.AsyncClient, item_id: str) -> str:
    return str((await client.get(f"/v1/interactions/{item_id}")).json()["status"])


async def test_the_failed_list_of_a_queue_shows_each_items_error(client: httpx.AsyncClient) -> None:
    await _failed_items(client, "mail", 2)
    page = await client.get("/ui/interactions/queues/mail?status=failed")
    assert page.status_code == 200
    assert "<th>error</th>" in page.text and "smtp said no #0" in page.text and "smtp said no #1" in page.text


async def test_retry_selected_failed_items_in_bulk_leaves_the_others_failed(client: httpx.AsyncClient) -> None:
    ids = await _failed_items(client, "mail", 3)
    page = await client.post("/ui/interactions/queues/mail/bulk", data={"action": "retry", "status": "failed", "ids": ids[:2]}, follow_redirects=True)
    assert "retried 2" in html.unescape(page.text)
    assert [await _status(client, i) for i in ids] == ["ready", "ready", "failed"]


async def test_retry_all_matching_the_filter_retries_every_failed_item_of_the_queue(client: httpx.AsyncClient) -> None:
    ids = await _failed_items(client, "mail", 3)
    other = await _failed_items(client, "other", 1)
    page = await client.post("/ui/interactions/queues/mail/bulk", data={"action": "retry", "status": "failed", "all": "true"}, follow_redirects=True)
    assert "retried 3" in html.unescape(page.text)
    assert {await _status(client, i) for i in ids} == {"ready"}
    assert await _status(client, other[0]) == "failed", "another queue's items are not touched"


async def test_cancel_in_bulk_cancels_unfinished_items_and_counts_the_refused_ones(client: httpx.AsyncClient) -> None:
    waiting = [str((await client.post("/v1/queues/mail/interactions", json={"process_in_ms": 60_000})).json()["id"]) for _ in range(2)]
    done = str((await client.post("/v1/queues/mail/interactions", json={"completed": True})).json()["id"])
    page = await client.post("/ui/interactions/queues/mail/bulk", data={"action": "cancel", "ids": [*waiting, done]}, follow_redirects=True)
    assert "cancelled 2; refused 1 (interaction_finished)" in html.unescape(page.text)
    assert [await _status(client, i) for i in waiting] == ["cancelled", "cancelled"]
    assert await _status(client, done) == "completed"


async def test_cancel_all_matching_cancels_every_scheduled_item(client: httpx.AsyncClient) -> None:
    for _ in range(3):
        await client.post("/v1/queues/mail/interactions", json={"process_in_ms": 60_000})
    await client.post("/ui/interactions/queues/mail/bulk", data={"action": "cancel", "status": "scheduled", "all": "true"})
    counts = (await client.get("/v1/queues/mail")).json()["counts"]
    assert (counts["scheduled"], counts["cancelled"]) == (0, 3)


async def test_a_bulk_action_with_nothing_selected_or_an_unknown_action_changes_nothing(client: httpx.AsyncClient) -> None:
    ids = await _failed_items(client, "mail", 1)
    empty = await client.post("/ui/interactions/queues/mail/bulk", data={"action": "retry"}, follow_redirects=True)
    assert "nothing selected" in empty.text
    assert (await client.post("/ui/interactions/queues/mail/bulk", data={"action": "explode", "ids": ids})).status_code == 422
    assert await _status(client, ids[0]) == "failed"


async def test_the_queue_page_shows_its_limits_and_pause_stops_leasing_until_resume(client: httpx.AsyncClient) -> None:
    await client.put("/v1/queues/mail", json={"concurrency": 4, "rate_limit": {"count": 10, "per_ms": 1000}})
    await client.post("/v1/queues/mail/interactions", json={})
    page = await client.get("/ui/interactions/queues/mail")
    assert "10 per 1000 ms" in page.text and 'data-action="pause"' in page.text
    paused = await client.post("/ui/interactions/queues/mail/pause", follow_redirects=True)
    assert "paused: nothing is leased until resumed" in paused.text and 'data-action="resume"' in paused.text
    assert (await client.get("/v1/queues/mail")).json()["paused"] is True
    assert (await client.post("/v1/queues/mail/lease", json={"worker": "w", "max": 5})).json()["interactions"] == []
    assert "paused" in (await client.get("/ui/interactions")).text
    await client.post("/ui/interactions/queues/mail/resume")
    assert len((await client.post("/v1/queues/mail/lease", json={"worker": "w", "max": 5})).json()["interactions"]) == 1


async def test_the_queue_page_shows_the_owner_settings_and_the_busiest_owners(client: httpx.AsyncClient) -> None:
    await client.put("/v1/queues/tenants", json={"owner_by": "user", "fair": True, "weights": {"big": 3}, "priority_aging_ms": 5000,
                                                 "per_owner": {"concurrency": 2, "rate_limit": {"count": 7, "per_ms": 1000}}})
    items = [{"user": "big"}] * 5 + [{"user": "small"}] * 2 + [{}]
    await client.post("/v1/queues/tenants/interactions/bulk", json={"interactions": items})
    await client.post("/v1/queues/tenants/lease", json={"worker": "w", "max": 1})
    page = (await client.get("/ui/interactions/queues/tenants")).text
    assert "concurrency 2" in page and "7 per 1000 ms" in page and "big=3" in page and "+1 every 5000 ms waited" in page
    rows = re.findall(r'<tr data-owner="([^"]*)"><td>[^<]*</td><td>(\d+)</td><td>(\d+)</td></tr>', page)
    assert rows == [("big", "5", "0"), ("small", "2", "0"), ("", "0", "1")], "the owner '' went first: its name sorts first"
    plain = (await client.get("/ui/interactions/queues/mail")).text
    assert 'id="owners"' not in plain


async def test_failed_machines_are_repaired_in_bulk_selected_or_all_matching(client: httpx.AsyncClient, processor: OrdersProcessor) -> None:
    for machine_id in ("m1", "m2", "m3"):
        await failed_machine(client, machine_id)
    listed = await client.get(f"/ui/machines?ns={NS}&status=failed")
    assert 'name="machines"' in listed.text and 'data-action="repair-all"' in listed.text
    page = await client.post("/ui/machines/bulk-repair", data={"machines": [f"{NS}/m1", f"{NS}/m2"], "simple": "false", "args": '{"by": "ops"}'},
                             follow_redirects=True)
    assert "repaired 2" in page.text
    statuses = [(await client.get(f"/v1/namespaces/{NS}/machines/{m}")).json()["status"] for m in ("m1", "m2", "m3")]
    assert statuses == ["working", "working", "failed"]
    again = await client.post("/ui/machines/bulk-repair", data={"machines": [f"{NS}/m1"], "simple": "true"}, follow_redirects=True)
    assert "refused 1 (machine_already_working)" in html.unescape(again.text)
    await client.post("/ui/machines/bulk-repair", data={"all": "true", "ns": NS, "simple": "true"})
    assert (await client.get(f"/v1/namespaces/{NS}/machines/m3")).json()["status"] == "working"


async def test_a_message_opens_to_its_body_cut_at_64_kib_with_a_note(client: httpx.AsyncClient) -> None:
    small = (await client.post(f"{MAILBOX}/messages", content=b"<order id='1'>hello</order>")).json()
    big = (await client.post(f"{MAILBOX}/messages", content=b"x" * (70 * 1024) + b"TAIL")).json()
    mailbox = await client.get("/ui/exchange/mailboxes/mobile-a/db-1")
    assert f'href="/ui/exchange/messages/{small["id"]}"' in mailbox.text
    page = await client.get(f"/ui/exchange/messages/{small['id']}")
    assert "&lt;order id=&#39;1&#39;&gt;hello&lt;/order&gt;" in page.text and 'id="body-truncated"' not in page.text
    cut = await client.get(f"/ui/exchange/messages/{big['id']}")
    body = re.search(r'<pre id="message-body" class="body">(.*?)</pre>', cut.text, re.S)
    assert body is not None and len(body.group(1)) == 64 * 1024 and "TAIL" not in cut.text
    assert 'id="body-truncated"' in cut.text and "Only the first 64 KiB" in cut.text
    assert (await client.get("/ui/exchange/messages/nope")).status_code == 404


async def test_an_alert_links_to_its_subject_and_closes_itself_when_the_machine_is_repaired(
    client: httpx.AsyncClient, processor: OrdersProcessor
) -> None:
    await failed_machine(client, "m1")
    overview = await client.get("/ui/")
    assert f'class="alert-subject" href="/ui/machines/{NS}/m1"' in overview.text
    await client.post(f"/ui/machines/{NS}/m1/repair", data={"simple": "true"})

    async def closed() -> str | None:
        page = (await client.get("/ui/overview/live")).text
        return page if "Nothing needs a person" in page and 'id="closed-alerts"' in page else None

    page = await eventually(closed, what="the alert closed itself")
    assert "machine repaired" in page and "mainspring" in page


async def test_a_file_move_the_disk_refuses_is_listed_with_its_error_on_the_exchange_and_message_pages(
    client: httpx.AsyncClient, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid, ids = await in_doubt_process(client, clock)

    def refuse(*args: object) -> bool:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.Disk, "place", refuse)
    await client.post(f"/ui/exchange/processes/{pid}/resolve", data={"committed": "false"})
    failures = (await client.get("/ui/exchange")).text.split("Cleanup failures", 1)[1]
    assert all(f"<code>{i}</code>" in failures for i in ids) and f"<code>{pid}</code>" in failures
    assert "mobile-a/db-1" in failures and "No space left on device" in failures
    page = await client.get(f"/ui/exchange/messages/{ids[0]}")
    assert page.status_code == 200 and "AVAILABLE" in page.text and "No space left on device" in page.text
    assert f"mailboxes/mobile-a/db-1/{ids[0]}" in page.text


async def test_an_in_doubt_alert_links_to_its_process_page_which_resolves_it(client: httpx.AsyncClient, clock: ManualClock) -> None:
    pid, ids = await in_doubt_process(client, clock)
    overview = await client.get("/ui/")
    assert f'href="/ui/exchange/processes/{pid}"' in overview.text
    page = await client.get(f"/ui/exchange/processes/{pid}")
    assert page.status_code == 200 and 'data-resolve="not-committed"' in page.text and ids[0] in page.text
    await client.post(f"/ui/exchange/processes/{pid}/resolve", data={"committed": "false"})

    async def closed() -> bool:
        return not (await client.get("/v1/alerts", params={"open": "true"})).json()["alerts"]

    await eventually(closed, what="the in-doubt alert closed itself")


async def test_the_namespace_page_shows_processor_retry_policy_and_history_range(client: httpx.AsyncClient) -> None:
    reply = await client.put("/v1/namespaces/billing", json={"processor": {"url": "http://127.0.0.1:9/p", "timeout_ms": 1500},
                                                             "retry": {"initial_ms": 250, "factor": 3, "max_ms": 9000, "max_attempts": 7}})
    assert reply.status_code == 200, reply.text
    page = await client.get("/ui/machines/namespaces/billing")
    assert page.status_code == 200
    assert "http://127.0.0.1:9/p" in page.text and "1500 ms" in page.text and "max_attempts" in page.text and ">7<" in page.text
    assert (await client.get("/ui/machines/namespaces/nope")).status_code == 404


async def test_the_login_error_names_the_scopes_plainly(client: httpx.AsyncClient, tokens: dict[str, str]) -> None:
    refused = await client.post("/ui/login", data={"token": tokens["worker"]})
    assert refused.status_code == 403
    assert "none of the scopes admin, ui" in refused.text and "[" not in html.unescape(refused.text.split('role="alert"')[1].split("</p>")[0])


async def test_form_labels_keep_their_text_in_one_piece(client: httpx.AsyncClient) -> None:
    for page in ("/ui/login", "/ui/events", "/ui/interactions"):
        text = (await client.get(page)).text
        assert not re.search(r"<label>[^<]+<code>", text), page


async def test_machines_with_any_id_open_from_the_list_the_machine_page_and_an_alert_link(client: httpx.AsyncClient, registry: App) -> None:
    """Fistful's namespace and ids (``/``, non-ASCII) are one percent-encoded segment each, never encoded twice."""
    registry.processors[FISTFUL_NS] = Registration(OrdersProcessor())
    ns = quote(FISTFUL_NS, safe="")
    for machine_id in ("abc/1", "платёж 1"):
        assert (await client.post(f"/v1/namespaces/{ns}/machines", json={"id": machine_id, "args": {}})).status_code == 201
    assert (await client.post(f"/v1/namespaces/{ns}/machines/abc%2F1/call", json={"args": "break"})).status_code == 502
    slash = f"/ui/machines/{ns}/abc%2F1"
    other = f"/ui/machines/{ns}/{quote('платёж 1', safe='')}"

    listed = await client.get(f"/ui/machines?ns={ns}")
    assert listed.status_code == 200 and f'href="{slash}"' in listed.text and f'href="{other}"' in listed.text
    assert f'href="/ui/machines/namespaces/{ns}"' in listed.text
    overview = await client.get("/ui/")
    assert f'class="alert-subject" href="{slash}"' in overview.text
    page = await client.get(slash)
    assert page.status_code == 200 and "abc/1" in page.text and "the order book is corrupt" in page.text
    assert f'action="{slash}/repair"' in page.text and f'href="/ui/machines?ns={ns}"' in page.text
    unicode_page = await client.get(other)
    assert unicode_page.status_code == 200 and html.escape("платёж 1") in unicode_page.text
    assert (await client.get(f"/ui/machines/namespaces/{ns}")).status_code == 200
    assert (await client.get(f"/ui/machines?ns={ns}&id={quote('abc/1', safe='')}")).headers["location"] == slash

    repaired = await client.post(f"{slash}/repair", data={"simple": "true"})
    assert repaired.status_code == 303 and repaired.headers["location"].startswith(f"{slash}?")
    assert (await client.get(f"/v1/namespaces/{ns}/machines/abc%2F1")).json()["status"] == "working"
    assert (await client.post(f"/v1/namespaces/{ns}/machines/abc%2F1/call", json={"args": "break"})).status_code == 502
    bulk = await client.post("/ui/machines/bulk-repair", data={"machines": [f"{ns}/abc%2F1"], "simple": "true"}, follow_redirects=True)
    assert "simply repaired 1" in html.unescape(bulk.text)
    assert (await client.get(f"/ui/machines/{ns}/nul%00")).status_code == 422  # as the API refuses it

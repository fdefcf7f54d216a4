"""Scopes: producers send only to their addressees, receivers see only theirs, resolve is admin's."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mainspring.config import Settings, load_settings

TOKENS = {
    "sender": ["exchange:send:mobile-a"],
    "receiver": ["exchange:receive:mobile-a", "exchange:send:mobile-b"],
    "stranger": ["exchange:receive:mobile-z"],
    "boss": ["admin"],
}
MAILBOX = "/v1/exchange/mailboxes/mobile-a/db-1"
PR = "/v1/exchange/processes"


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 200},
        auth={"tokens": [{"token_sha256": hashlib.sha256(name.encode()).hexdigest(), "scopes": scopes, "name": name}
                         for name, scopes in TOKENS.items()]},
    )


def as_(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {name}"}


async def test_without_a_token_every_exchange_call_is_401(client):
    assert (await client.post(f"{MAILBOX}/messages", content=b"x")).status_code == 401
    assert (await client.get(f"{MAILBOX}/messages")).json()["code"] == "unauthenticated"


async def test_a_sender_stores_only_to_its_addressee_and_cannot_receive(client):
    assert (await client.post(f"{MAILBOX}/messages", content=b"x", headers=as_("sender"))).status_code == 201
    other = await client.post("/v1/exchange/mailboxes/mobile-b/db-1/messages", content=b"x", headers=as_("sender"))
    assert other.status_code == 403 and other.json()["code"] == "forbidden"
    assert (await client.get(f"{MAILBOX}/messages", headers=as_("sender"))).status_code == 403


async def test_a_receiver_runs_the_protocol_on_its_mailbox_and_a_stranger_cannot_touch_it(client):
    m = (await client.post(f"{MAILBOX}/messages", content=b"x", headers=as_("sender"))).json()
    assert (await client.get(f"{MAILBOX}/messages", headers=as_("stranger"))).status_code == 403
    assert (await client.post(f"{MAILBOX}/processes", headers=as_("stranger"),
                              json={"client_id": "g", "message_ids": [m["id"]]})).status_code == 403
    started = await client.post(f"{MAILBOX}/processes", headers=as_("receiver"), json={"client_id": "g", "message_ids": [m["id"]]})
    assert started.status_code == 201
    pid = started.json()["id"]
    # Another receiver's process is answered as an unknown one is (existence does not leak).
    for call, status in (("heartbeat", 409), ("ready", 409), ("committed", 409), ("commit-failed", 404)):
        assert (await client.post(f"{PR}/{pid}/{call}", headers=as_("stranger"))).status_code == status, call
    assert (await client.get(f"{PR}/{pid}", headers=as_("stranger"))).status_code == 404
    reply = {"replies": [{"addressee": "mobile-b", "database": "db-1", "body": "r"}]}
    assert (await client.post(f"{PR}/{pid}/ready", json=reply, headers=as_("receiver"))).status_code == 200
    assert (await client.post(f"{PR}/{pid}/committed", headers=as_("receiver"))).json()["state"] == "DONE"


async def test_replies_need_the_send_scope_of_their_addressee(client):
    m = (await client.post(f"{MAILBOX}/messages", content=b"x", headers=as_("sender"))).json()
    pid = (await client.post(f"{MAILBOX}/processes", headers=as_("receiver"),
                             json={"client_id": "g", "message_ids": [m["id"]]})).json()["id"]
    bad = {"replies": [{"addressee": "mobile-q", "database": "db-1", "body": "r"}]}
    response = await client.post(f"{PR}/{pid}/ready", json=bad, headers=as_("receiver"))
    assert response.status_code == 403
    assert (await client.get(f"{PR}/{pid}", headers=as_("receiver"))).json()["state"] == "STARTED"


async def test_resolve_and_listing_all_processes_need_admin(client):
    assert (await client.post(f"{PR}/p-x/resolve", json={"committed": True}, headers=as_("receiver"))).status_code == 403
    assert (await client.get(PR, headers=as_("receiver"))).status_code == 403
    assert (await client.get(f"{PR}?addressee=mobile-a", headers=as_("receiver"))).status_code == 200
    assert (await client.get(PR, headers=as_("boss"))).status_code == 200
    assert (await client.post(f"{PR}/p-x/resolve", json={"committed": True}, headers=as_("boss"))).status_code == 404


async def test_mailbox_listing_shows_only_the_callers_addressees(client):
    await client.post(f"{MAILBOX}/messages", content=b"x", headers=as_("sender"))
    mine = (await client.get("/v1/exchange/mailboxes", headers=as_("receiver"))).json()["mailboxes"]
    assert [(b["addressee"], b["available"]) for b in mine] == [("mobile-a", 1)]
    assert (await client.get("/v1/exchange/mailboxes", headers=as_("stranger"))).json()["mailboxes"] == []


async def test_a_token_not_receiving_a_process_raises_no_alert_by_reporting_it_committed(client):
    """Finding 4: API_4 from a token that may not receive the process's messages is refused before anything
    is stored — no alert, for a known id or an unknown one (no alert flooding)."""
    m = (await client.post(f"{MAILBOX}/messages", content=b"x", headers=as_("sender"))).json()
    pid = (await client.post(f"{MAILBOX}/processes", headers=as_("receiver"),
                             json={"client_id": "g", "message_ids": [m["id"]]})).json()["id"]
    for process_id in (pid, "p-unknown-1", "p-unknown-2"):
        refused = await client.post(f"{PR}/{process_id}/committed", headers=as_("sender"))
        assert refused.status_code == 409 and refused.json()["code"] == "cancelled"
    known = await client.post(f"{PR}/{pid}/committed", headers=as_("stranger"))
    assert known.json()["detail"] == f"no process {pid}"
    alerts = (await client.get("/v1/alerts", headers=as_("boss"))).json()["alerts"]
    assert [a for a in alerts if a["code"] == "exchange_commit_not_allowed"] == []
    assert (await client.get(f"{PR}/{pid}", headers=as_("receiver"))).json()["state"] == "STARTED"
    # The process's receiver reporting an unknown process still raises the alert API.md describes.
    assert (await client.post(f"{PR}/p-gone/committed", headers=as_("receiver"))).status_code == 409
    alerts = (await client.get("/v1/alerts", headers=as_("boss"))).json()["alerts"]
    assert [a["subject"]["id"] for a in alerts if a["code"] == "exchange_commit_not_allowed"] == ["p-gone"]

"""Storing, listing and reading messages (API.md §1: store a message, API_1, read one)."""

from __future__ import annotations

import hashlib

from tests.exchange.conftest import MAILBOX, event_types, files_under, listed, put, start


async def test_store_answers_201_with_the_message_and_writes_its_file(client, exchange_dir, store):
    response = await client.post(f"{MAILBOX}/messages", content=b"payload",
                                 headers={"Content-Type": "application/xml", "X-Sender": "phone-7"})
    assert response.status_code == 201
    message = response.json()
    assert message["addressee"] == "mobile-a" and message["database"] == "db-1"
    assert message["size"] == 7 and message["sha256"] == hashlib.sha256(b"payload").hexdigest()
    assert message["content_type"] == "application/xml" and message["sender"] == "phone-7"
    assert message["created_at"].endswith("Z")
    path = exchange_dir / "mailboxes" / "mobile-a" / "db-1" / message["id"]
    assert path.read_bytes() == b"payload"
    assert files_under(exchange_dir) == {f"mailboxes/mobile-a/db-1/{message['id']}"}, "no temp files left"
    assert await event_types(store, message["id"]) == ["exchange.message.stored"]


async def test_same_message_id_with_same_bytes_answers_200_and_the_same_message(client, exchange_dir):
    first = await client.post(f"{MAILBOX}/messages", content=b"x", headers={"Message-Id": "order-1"})
    again = await client.post(f"{MAILBOX}/messages", content=b"x", headers={"Message-Id": "order-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert len((await listed(client))["messages"]) == 1
    assert len(files_under(exchange_dir)) == 1


async def test_same_message_id_with_other_bytes_is_message_id_conflict(client):
    await client.post(f"{MAILBOX}/messages", content=b"x", headers={"Message-Id": "order-1"})
    response = await client.post(f"{MAILBOX}/messages", content=b"y", headers={"Message-Id": "order-1"})
    assert response.status_code == 409 and response.json()["code"] == "message_id_conflict"
    assert response.headers["content-type"].startswith("application/problem+json")


async def test_message_id_is_scoped_to_the_mailbox(client):
    a = await client.post(f"{MAILBOX}/messages", content=b"x", headers={"Message-Id": "k"})
    b = await client.post("/v1/exchange/mailboxes/mobile-b/db-1/messages", content=b"y", headers={"Message-Id": "k"})
    assert (a.status_code, b.status_code) == (201, 201)


async def test_repeated_message_id_after_commit_is_still_the_same_message(client):
    m = await put(client, b"x", **{"Message-Id": "once"})
    pid = (await start(client, [m["id"]])).json()["id"]
    await client.post(f"/v1/exchange/processes/{pid}/ready")
    await client.post(f"/v1/exchange/processes/{pid}/committed")
    again = await client.post(f"{MAILBOX}/messages", content=b"x", headers={"Message-Id": "once"})
    assert again.status_code == 200 and again.json()["id"] == m["id"]
    assert (await listed(client))["messages"] == [], "a producer's retry never brings a processed message back"


async def test_body_over_the_limit_is_413_too_large_and_stores_nothing(client, exchange_dir):
    response = await client.post(f"{MAILBOX}/messages", content=b"x" * (64 * 1024 + 1))
    assert response.status_code == 413 and response.json()["code"] == "too_large"
    assert (await listed(client))["messages"] == []
    assert files_under(exchange_dir) == set()


async def test_names_with_path_tricks_are_422(client, exchange_dir):
    for path in ["/v1/exchange/mailboxes/.hidden/db/messages", "/v1/exchange/mailboxes/a%2F..%2Fb/db/messages",
                 "/v1/exchange/mailboxes/a/-x/messages", "/v1/exchange/mailboxes/" + "a" * 129 + "/db/messages"]:
        response = await client.post(path, content=b"x")
        assert response.status_code in (404, 422), path
        if response.status_code == 422:
            assert response.json()["code"] == "invalid_request"
    bad_key = await client.post(f"{MAILBOX}/messages", content=b"x", headers={"Message-Id": "../../etc"})
    assert bad_key.status_code == 422 and bad_key.json()["code"] == "invalid_request"
    assert files_under(exchange_dir) == set()


async def test_list_is_oldest_first_and_pages_with_a_cursor(client, clock):
    ids = []
    for i in range(5):
        ids.append((await put(client, f"m{i}".encode()))["id"])
        clock.advance(1)
    first = (await client.get(f"{MAILBOX}/messages?limit=3")).json()
    assert [m["id"] for m in first["messages"]] == ids[:3]
    assert first["busy"] is False and first["active_process_id"] is None
    rest = (await client.get(f"{MAILBOX}/messages", params={"limit": 3, "cursor": first["next_cursor"]})).json()
    assert [m["id"] for m in rest["messages"]] == ids[3:] and rest["next_cursor"] is None


async def test_list_rejects_bad_limit_and_cursor_with_422(client):
    assert (await client.get(f"{MAILBOX}/messages?limit=0")).status_code == 422
    assert (await client.get(f"{MAILBOX}/messages?limit=abc")).status_code == 422
    assert (await client.get(f"{MAILBOX}/messages?cursor=%%%")).status_code == 422


async def test_read_one_answers_the_raw_bytes_with_their_content_type(client):
    m = await put(client, b"\x00\x01binary", **{"Content-Type": "application/x-thing"})
    response = await client.get(f"{MAILBOX}/messages/{m['id']}")
    assert response.status_code == 200
    assert response.content == b"\x00\x01binary"
    assert response.headers["content-type"].startswith("application/x-thing")


async def test_read_one_of_another_mailbox_or_unknown_is_404(client):
    m = await put(client, b"x")
    other = await client.get(f"/v1/exchange/mailboxes/mobile-b/db-1/messages/{m['id']}")
    assert other.status_code == 404 and other.json()["code"] == "message_not_found"
    assert (await client.get(f"{MAILBOX}/messages/m-nothing")).status_code == 404


async def test_an_empty_message_body_is_422_and_nothing_is_stored(client, exchange_dir):
    response = await client.post(f"{MAILBOX}/messages", content=b"", headers={"Content-Type": "text/plain"})
    assert response.status_code == 422 and response.json()["code"] == "invalid_request"
    assert (await listed(client))["messages"] == [] and files_under(exchange_dir) == set()


async def test_a_message_whose_content_type_is_not_a_media_type_is_422_and_nothing_is_stored(client, exchange_dir):
    for content_type in ("text/plain; charset=no-such-charset", "html", "text/plain; q"):
        response = await client.post(f"{MAILBOX}/messages", content=b"x", headers={"Content-Type": content_type})
        assert response.status_code == 422 and response.json()["code"] == "invalid_request", content_type
    assert (await listed(client))["messages"] == [] and files_under(exchange_dir) == set()

"""Transport and abuse: TLS serving, request rate limits, injection strings that change nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from mainspring.api import create_app
from mainspring.config import load_settings
from mainspring.core.auth import hash_token
from mainspring.store import Store

INJECTIONS = ["' OR '1'='1", "1; DROP TABLE events; --", '"); DELETE FROM alerts; --', "%27%20OR%201=1", "$(rm -rf /)", "{{7*7}}"]


def make_certificate(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_server_serves_https_with_a_configured_certificate(servers: Any, tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    (server,) = servers(1, env={"MAINSPRING_SERVER__TLS_CERTFILE": str(cert), "MAINSPRING_SERVER__TLS_KEYFILE": str(key)}, wait=False)
    https = server.url.replace("http://", "https://")
    server.wait_ready(url=https, verify=str(cert))
    assert httpx.get(https + "/healthz", verify=str(cert)).json() == {"status": "ok"}
    with pytest.raises(httpx.HTTPError):
        httpx.get(https + "/healthz", verify=True)  # self-signed: refused by a default client


async def test_a_client_over_the_rate_limit_gets_429_with_retry_after(database_url: str, tmp_path: Path, store: Store) -> None:
    settings = load_settings(None, server={"database": database_url, "data_dir": tmp_path / "data", "rate_limit": "5/minute"})
    app = create_app(settings, store=store)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        answers = [(await client.get("/v1/alerts")).status_code for _ in range(7)]
        assert answers[:5] == [200] * 5 and answers[5:] == [429, 429]
        limited = await client.get("/v1/alerts")
        assert limited.json()["code"] == "rate_limited"
        assert int(limited.headers["retry-after"]) >= 1
        assert (await client.get("/healthz")).status_code == 200  # service endpoints are not limited


async def test_injection_strings_in_queries_and_paths_change_nothing(client: httpx.AsyncClient) -> None:
    for text in INJECTIONS:
        for response in (
            await client.get("/v1/events", params={"types": text}),
            await client.get("/v1/alerts", params={"cursor": text}),
            await client.post(f"/v1/alerts/{text}/ack"),
        ):
            assert response.status_code < 500, (text, response.text)
    assert (await client.get("/v1/events")).json()["events"] == []


HOSTILE_HEADER_VALUES = [*INJECTIONS, "../../../../etc/passwd", "%0d%0aSet-Cookie: stolen=1", "${jndi:ldap://x/a}", "x" * 10_000, " ", ""]


async def test_hostile_header_values_are_refused_or_kept_as_plain_data(client: httpx.AsyncClient) -> None:
    """Every request header the API reads, with injection strings, traversal, 10 KB and empty values."""
    reads = [
        ("POST", "/v1/exchange/mailboxes/a/b/messages", "Message-Id"),
        ("POST", "/v1/exchange/mailboxes/a/b/messages", "Content-Type"),
        ("POST", "/v1/exchange/mailboxes/a/b/messages", "X-Sender"),
        ("POST", "/v1/namespaces/ns/machines", "Idempotency-Key"),
        ("GET", "/v1/events", "Authorization"),
        ("GET", "/v1/events", "Last-Event-ID"),
    ]
    for method, path, header in reads:
        for value in HOSTILE_HEADER_VALUES:
            body = b"x" if "exchange" in path else b'{"id": "m1"}'
            answer = await client.request(method, path, content=body, headers={header: value})
            where = (header, value[:40], answer.status_code, answer.text[:200])
            assert answer.status_code < 500, where
            if answer.status_code >= 400:
                assert answer.headers["content-type"].startswith("application/problem+json"), where
            assert "stolen" not in str(answer.headers).lower(), where
            if len(value) > 1000 and header not in ("Authorization", "Last-Event-ID"):
                # What is stored is bounded (an open server ignores Authorization; /v1/events reads
                # Last-Event-ID only on the stream).
                assert answer.status_code in (400, 413, 422, 431), where


async def test_the_rate_limit_counts_a_token_however_it_is_written_and_unknown_tokens_by_address(
        database_url: str, tmp_path: Path, store: Store) -> None:
    settings = load_settings(None, server={"database": database_url, "data_dir": tmp_path / "data", "rate_limit": "5/minute"},
                             auth={"tokens": [{"token_sha256": hash_token("t-1"), "scopes": ["admin"]}]})
    app = create_app(settings, store=store)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        spellings = ["Bearer t-1", "bearer t-1", "BEARER  t-1", " Bearer t-1 ", "Bearer\tt-1", "bEaReR t-1 ", "Bearer t-1"]
        answers = [(await client.get("/v1/alerts", headers={"Authorization": a})).status_code for a in spellings]
        assert answers == [200] * 5 + [429, 429]
        elsewhere = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("10.0.0.9", 4000)), base_url="http://t")
        async with elsewhere:
            unknown = [(await elsewhere.get("/v1/alerts", headers={"Authorization": f"Bearer guess-{n}"})).status_code for n in range(7)]
            assert unknown == [401] * 5 + [429, 429]


def open_app(database_url: str, tmp_path: Path, store: Store, **server: Any) -> Any:
    return create_app(load_settings(None, server={"database": database_url, "data_dir": tmp_path / "data", **server}), store=store)


LOCAL = "http://127.0.0.1:8080"


async def test_an_open_server_refuses_writes_from_another_sites_pages(database_url: str, tmp_path: Path, store: Store) -> None:
    app = open_app(database_url, tmp_path, store, allowed_origins=["https://ops.example.com"])
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=LOCAL) as client:
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        for browser in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"},
                        {"Origin": "http://127.0.0.1:9999"}, {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors"}):
            refused = await client.post("/v1/queues/victim/pause", headers={**form, **browser})
            assert refused.status_code == 403 and refused.json()["code"] == "cross_site_refused", browser
        assert (await client.get("/v1/queues/victim")).json()["paused"] is False
        for allowed in ({"Origin": LOCAL}, {"Origin": "https://ops.example.com"}, {"Sec-Fetch-Site": "same-origin"}, {}):
            assert (await client.post("/v1/queues/victim/pause", headers=allowed)).status_code == 200, allowed
        # Reading from another site is the browser's to refuse (no CORS), and harmless for it to send.
        assert (await client.get("/v1/alerts", headers={"Origin": "http://evil.example"})).status_code == 200


async def test_an_open_server_answers_a_browser_only_by_its_own_names_against_dns_rebinding(
        database_url: str, tmp_path: Path, store: Store) -> None:
    app = open_app(database_url, tmp_path, store)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=LOCAL) as client:
        rebound = {"Host": "evil.example:8080", "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
        for path in ("/v1/alerts", "/ui/"):
            refused = await client.get(path, headers=rebound)
            assert refused.status_code == 403, path
        assert (await client.get("/healthz", headers=rebound)).status_code == 200  # probes name the server by address
        for host in ("localhost:8080", "127.0.0.1", "[::1]:8080"):
            assert (await client.get("/v1/alerts", headers={**rebound, "Host": host})).status_code == 200, host


async def test_with_allowed_hosts_set_every_request_must_name_one(database_url: str, tmp_path: Path, store: Store) -> None:
    app = open_app(database_url, tmp_path, store, allowed_hosts=["mainspring.internal", "*.example.com"])
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=LOCAL) as client:
        assert (await client.get("/v1/alerts", headers={"Host": "evil.example"})).status_code == 403
        assert (await client.get("/v1/alerts", headers={"Host": "127.0.0.1:8080"})).status_code == 403
        for host in ("mainspring.internal:8080", "ops.example.com"):
            assert (await client.get("/v1/alerts", headers={"Host": host})).status_code == 200, host


async def test_a_json_body_sent_as_a_form_or_text_is_415(client: httpx.AsyncClient) -> None:
    for media in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"):
        answer = await client.put("/v1/queues/q1", content=b'{"concurrency": 1}', headers={"Content-Type": media})
        assert answer.status_code == 415 and answer.json()["code"] == "unsupported_media_type", media
    assert (await client.put("/v1/queues/q1", json={"concurrency": 1})).status_code == 200

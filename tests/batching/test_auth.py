"""Scopes: batchers:<name> guards a batcher's routes, and a package's routes by the package's batcher."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mainspring.config import Settings, load_settings

BOOKS = "ms_books_token"
OTHER = "ms_other_token"


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    tokens = [
        {"token_sha256": hashlib.sha256(BOOKS.encode()).hexdigest(), "scopes": ["batchers:books"], "name": "books"},
        {"token_sha256": hashlib.sha256(OTHER.encode()).hexdigest(), "scopes": ["batchers:other*"], "name": "other"},
    ]
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 100, "sqlite_synchronous": "NORMAL"},
        auth={"tokens": tokens},
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_batcher_routes_need_the_batchers_scope(client) -> None:
    task = {"id": "t", "group": "g", "member": "m", "content": "x"}
    assert (await client.post("/v1/batchers/books/tasks", json=task)).status_code == 401
    denied = await client.post("/v1/batchers/books/tasks", json=task, headers=bearer(OTHER))
    assert denied.status_code == 403 and denied.json()["code"] == "forbidden"
    assert (await client.post("/v1/batchers/books/tasks", json=task, headers=bearer(BOOKS))).status_code == 202
    assert (await client.get("/v1/batchers/books/tasks/t", headers=bearer(OTHER))).status_code == 403
    assert (await client.post("/v1/batchers/other-1/tasks", json=task, headers=bearer(OTHER))).status_code == 202
    assert (await client.delete("/v1/batchers/books")).status_code == 401
    assert (await client.delete("/v1/batchers/books", headers=bearer(OTHER))).status_code == 403
    assert (await client.delete("/v1/batchers/books", headers=bearer(BOOKS))).status_code == 204


async def test_a_package_by_id_checks_the_scope_of_its_batcher(client) -> None:
    books = bearer(BOOKS)
    await client.put("/v1/batchers/books", json={"max_size": 2}, headers=books)
    for member in ("en", "ru"):
        body = {"id": f"79-{member}", "group": "79", "member": member, "content": member}
        assert (await client.post("/v1/batchers/books/tasks", json=body, headers=books)).status_code == 202
    response = await client.post("/v1/batchers/books/packages/claim", json={"worker": "w", "wait_ms": 5000}, headers=books)
    package = response.json()
    token = package["lease"]["token"]
    for path, body in [("complete", {"token": token}), ("heartbeat", {"token": token}), ("fail", {"token": token, "error": "x"})]:
        denied = await client.post(f"/v1/packages/{package['id']}/{path}", json=body, headers=bearer(OTHER))
        assert denied.status_code == 404 and denied.json()["code"] == "package_not_found", path
    assert (await client.get(f"/v1/packages/{package['id']}", headers=bearer(OTHER))).status_code == 404
    done = await client.post(f"/v1/packages/{package['id']}/complete", json={"token": token}, headers=books)
    assert done.status_code == 200 and done.json()["status"] == "done"

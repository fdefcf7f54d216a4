"""Logs for machines and people: JSON lines with UTC timestamps and the ids of what they are about."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import httpx
import pytest

from mainspring.core.logs import bound, configure_logging


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging("INFO", "json")
    handler = logging.getLogger().handlers[0]
    handler.setStream(stream)  # type: ignore[attr-defined]
    yield stream
    configure_logging("INFO", "text")


def _records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_a_json_line_has_an_iso_utc_time_and_the_bound_ids_as_fields(json_lines: io.StringIO) -> None:
    with bound(queue="emails", interaction_id="17"):
        logging.getLogger("mainspring.test").warning("handler of %s raised", "emails")
    logging.getLogger("mainspring.test").warning("outside")
    inside, outside = _records(json_lines)
    assert inside["message"] == "handler of emails raised" and inside["level"] == "WARNING"
    assert (inside["queue"], inside["interaction_id"]) == ("emails", "17")
    assert str(inside["time"]).endswith("Z") and "T" in str(inside["time"])
    assert "queue" not in outside


async def test_every_answer_carries_a_request_id_and_keeps_the_callers(client: httpx.AsyncClient) -> None:
    fresh = await client.get("/v1/events")
    assert len(fresh.headers["x-request-id"]) == 32
    given = await client.get("/v1/events", headers={"X-Request-Id": "trace-abc.1"})
    assert given.headers["x-request-id"] == "trace-abc.1"
    hostile = await client.get("/v1/events", headers={"X-Request-Id": "x" * 500})
    assert hostile.headers["x-request-id"] != "x" * 500


async def test_a_line_logged_in_a_request_carries_its_request_id_and_path_ids(
    client: httpx.AsyncClient, json_lines: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mainspring.interactions import service
    from mainspring.interactions.errors import InteractionNotFound

    async def logging_complete(_store: object, interaction_id: str, _result: object) -> dict[str, object]:
        logging.getLogger("mainspring.test").info("looking for %s", interaction_id)
        raise InteractionNotFound("gone")

    monkeypatch.setattr(service, "complete", logging_complete)
    answer = await client.post("/v1/interactions/424242/complete", json={}, headers={"X-Request-Id": "req-1"})
    assert answer.status_code == 404
    (line,) = [r for r in _records(json_lines) if r["message"] == "looking for 424242"]
    assert (line["request_id"], line["interaction_id"]) == ("req-1", "424242")


def test_httpx_request_lines_stay_out_of_the_log() -> None:
    configure_logging("INFO", "text")
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    configure_logging("DEBUG", "text")
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    configure_logging("INFO", "text", access_log=True)
    assert not logging.getLogger("uvicorn.access").disabled
    configure_logging("INFO", "text")
    assert logging.getLogger("uvicorn.access").disabled

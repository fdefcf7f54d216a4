"""What /openapi.json allows, the server takes; what it forbids, the server refuses (issue 34: schemathesis with
every check). Each test names a rule the description used not to say, or a request it allowed that was refused."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import free_port


async def created(client: httpx.AsyncClient, queue: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(f"/v1/queues/{queue}/interactions", json=body)
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


async def test_a_whole_number_written_as_a_float_is_taken_where_an_integer_is_declared(client: httpx.AsyncClient) -> None:
    # JSON Schema calls 5000.0 an integer; strictness stays for the rest (false is not 0, 2.5 is not 2).
    item = await created(client, "floats", {"process_in_ms": 5000.0, "priority": -3.0, "data": {"kept": 1.0}})
    assert item["priority"] == -3 and item["status"] == "scheduled"
    assert item["data"] == {"kept": 1.0} and isinstance(item["data"]["kept"], float)
    for refused in ({"process_in_ms": 2.5}, {"priority": False}, {"priority": "3"}, {"process_in_ms": 1e300}):
        response = await client.post("/v1/queues/floats/interactions", json=refused)
        assert response.status_code == 422 and response.json()["code"] == "invalid_request", refused
    many = await client.post("/v1/queues/floats/interactions/bulk", json={"interactions": [{"priority": 2.0}, {"priority": 1.0, "process_in_ms": 0.0}]})
    assert many.status_code == 201, many.text
    leased = await client.post("/v1/queues/floats/lease", json={"worker": "w", "max": 3.0})
    assert leased.status_code == 200 and len(leased.json()["interactions"]) == 2


async def test_any_cursor_its_pattern_allows_is_a_page_and_any_other_is_422(client: httpx.AsyncClient) -> None:
    first = await created(client, "paged", {})
    await created(client, "paged", {})
    page = (await client.get("/v1/queues/paged/interactions", params={"limit": 1})).json()
    assert [i["id"] for i in page["interactions"]] == [first["id"]]
    after = (await client.get("/v1/queues/paged/interactions", params={"limit": 1, "cursor": page["next_cursor"]})).json()
    assert len(after["interactions"]) == 1 and after["interactions"][0]["id"] != first["id"]
    allowed = {
        "/v1/queues/paged/interactions": "0" * 18,
        f"/v1/interactions/{first['id']}/children": "0.999999999999999999",
        "/v1/alerts": "1764410000000.zz9",
        "/v1/exchange/processes": "0.p0",
        "/v1/exchange/mailboxes/a/b/messages": "999999999999999999.m",
        "/v1/batchers/books/packages": "7",
    }
    for path, cursor in allowed.items():
        response = await client.get(path, params={"cursor": cursor})
        assert response.status_code == 200, (path, response.text)
    for path in allowed:
        for cursor in ("0" * 19, "x", "1.", ".1", "1.2.3!", "-1"):
            response = await client.get(path, params={"cursor": cursor})
            assert response.status_code == 422 and response.json()["code"] == "invalid_request", (path, cursor)
    assert (await client.get("/v1/events", params={"after": "0" * 18})).status_code == 200
    assert (await client.get("/v1/events", params={"after": "0" * 19})).status_code == 422


async def test_the_description_says_the_rules_between_fields_and_of_stored_json(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    stored = schemas["StoredJson"]["anyOf"]
    assert {"pattern": "^[^\\x00]*$", "type": "string"} in stored
    assert {"additionalProperties": {"$ref": "#/components/schemas/StoredJson"}, "propertyNames": {"pattern": "^[^\\x00]*$"},
            "type": "object"} in stored
    assert [branch["required"] for branch in schemas["Reply"]["oneOf"]] == [["addressee", "database", "body"],
                                                                          ["addressee", "database", "body_base64"]]
    assert [list(branch["properties"]) for branch in schemas["OutcomeIn"]["oneOf"]] == [["complete"], ["fail"], ["repeat"], ["wait"], ["retry"]]
    assert [branch["required"] for branch in schemas["ScheduleIn"]["oneOf"]] == [["process_at"], ["process_in_ms"]]
    status = document["paths"]["/v1/queues/{queue}/interactions"]["get"]["parameters"]
    assert any(p["name"] == "status" and "pattern" in p["schema"]["anyOf"][0] for p in status)
    assert "anyOf" in schemas["QueueSettingsIn"] and "not" in schemas["CreateIn"]["allOf"][1]
    timezone = schemas["PeriodicIn"]["properties"]["timezone"]
    assert "Europe/Paris" in timezone["enum"] and "Mars/Base" not in timezone["enum"]
    read = document["paths"]["/v1/exchange/mailboxes/{addressee}/{database}/messages/{message_id}"]["get"]
    assert list(read["responses"]["200"]["content"]) == ["*/*"]


@pytest.mark.parametrize("outcome", [{"complete": {}, "fail": None}, {"wait": None}, {"repeat": {"in_ms": 5, "at": None}}])
async def test_an_outcome_is_one_field_not_null_as_its_description_says(client: httpx.AsyncClient, outcome: dict[str, Any]) -> None:
    # The description shows one object shape per outcome; a null beside it is another shape, refused.
    item = await created(client, "outcomes", {})
    lease = (await client.post("/v1/queues/outcomes/lease", json={"worker": "w"})).json()["interactions"][0]["lease"]
    refused = await client.post(f"/v1/interactions/{item['id']}/release", json={"token": lease["token"], "outcome": outcome})
    assert refused.status_code == 422 and refused.json()["code"] == "invalid_request"
    taken = await client.post(f"/v1/interactions/{item['id']}/release", json={"token": lease["token"], "outcome": {"complete": {}}})
    assert taken.status_code == 200 and taken.json()["status"] == "completed"


async def test_a_queue_batch_naming_an_id_twice_takes_its_entries_in_turn(client: httpx.AsyncClient) -> None:
    item = await created(client, "twice", {})
    token = (await client.post("/v1/queues/twice/lease", json={"worker": "w"})).json()["interactions"][0]["lease"]["token"]
    beat = await client.post("/v1/queues/twice/heartbeat", json={"leases": [{"id": item["id"], "token": "wrong"},
                                                                           {"id": item["id"], "token": token},
                                                                           {"id": item["id"], "token": token}]})
    assert beat.status_code == 200 and beat.json() == {"held": [item["id"], item["id"]], "lease_lost": [item["id"]]}
    done = {"complete": {"result": 1}}
    released = await client.post("/v1/queues/twice/release", json={"releases": [{"id": item["id"], "token": "wrong", "outcome": done},
                                                                                {"id": item["id"], "token": token, "outcome": done},
                                                                                {"id": item["id"], "token": token, "outcome": {"wait": {}}}]})
    assert released.status_code == 200 and released.json() == {"released": [item["id"]], "lease_lost": [item["id"], item["id"]]}
    assert (await client.get(f"/v1/interactions/{item['id']}")).json()["result"] == 1


async def test_start_in_a_namespace_no_processor_serves_here_is_404_namespace_not_found(client: httpx.AsyncClient) -> None:
    # A stored namespace without a URL is for an in-process processor of another server: nothing failed here.
    assert (await client.put("/v1/namespaces/elsewhere", json={})).status_code == 200
    response = await client.post("/v1/namespaces/elsewhere/machines", json={"id": "m1"})
    assert response.status_code == 404 and response.json()["code"] == "namespace_not_found"
    # A processor that cannot be reached is still the contract's transient 502.
    await client.put("/v1/namespaces/unreachable", json={"processor": {"url": f"http://127.0.0.1:{free_port()}/", "timeout_ms": 2000}})
    failed = await client.post("/v1/namespaces/unreachable/machines", json={"id": "m1"})
    assert failed.status_code == 502 and failed.json()["code"] == "processor_failed"

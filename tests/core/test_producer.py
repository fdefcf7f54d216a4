"""The direct producer writes through the same service code as the API: same validation, same events,
wake-ups that reach other processes, and committed when the call returns."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from mainspring.core import outbox
from mainspring.interactions import leasing
from mainspring.interactions.settings import InteractionsSettings
from mainspring.producer import producer
from mainspring.store import Clock, Store


async def test_a_produced_interaction_is_committed_with_its_event(database_url: str, tmp_path: Path) -> None:
    async with producer(database=database_url, data_dir=tmp_path) as mainspring:
        item = await mainspring.create("emails", data={"to": "ada"}, message_id="order-17", process_in_ms=0)
        again = await mainspring.create("emails", data={"to": "someone else"}, message_id="order-17")
    assert again["id"] == item["id"] and again["data"] == {"to": "ada"}
    store = Store(database_url)
    try:
        await outbox.wait_numbered(store)
        events, _ = await outbox.read_events(store, 0, 100, ["interaction.created"])
    finally:
        await store.close()
    assert [e["subject"]["id"] for e in events] == [item["id"]]


async def test_the_producer_answers_what_the_client_answers_typed_the_same(
    database_url: str, tmp_path: Path, client: httpx.AsyncClient
) -> None:
    """One typed answer everywhere: the producer's are the clients' TypedDicts, field for field the API's."""
    from typing import get_type_hints

    from mainspring.client import models as answers
    from mainspring.client._async.interactions import AsyncInteractionsClient
    from mainspring.producer import Producer

    for method, typed in (("create", answers.Interaction), ("submit", answers.Task), ("put", answers.Message), ("start", answers.Machine)):
        assert get_type_hints(getattr(Producer, method))["return"] is typed, method
        assert get_type_hints(AsyncInteractionsClient.create)["return"] is answers.Interaction
    async with producer(database=database_url, data_dir=tmp_path) as mainspring:
        item = await mainspring.create("emails", {"to": "ada"}, message_id="welcome-ada")
    over_http = (await client.get(f"/v1/interactions/{item['id']}")).json()
    assert item == over_http


async def test_the_producers_answers_are_the_api_models_dump_for_every_field_and_an_existing_failed_item(
    database_url: str, tmp_path: Path, client: httpx.AsyncClient
) -> None:
    """The producer answers ``to_api``'s dict without the model's validation and dump: the same JSON, field for field,
    for every field a create sets (one create, a bulk, a created-completed item) and for an existing item with an
    ``error_detail`` answered for its ``message_id``."""
    from mainspring.interactions import leasing
    from mainspring.interactions.models import Interaction
    from mainspring.interactions.outcomes import Fail

    cfg = InteractionsSettings()
    fields = {"name": "step", "channel": "web", "user": "ada", "source": "shop", "priority": 7}
    async with producer(database=database_url, data_dir=tmp_path) as mainspring:
        parent = await mainspring.create("emails", {"to": "ada"}, message_id="parent-1", **fields)
        child = await mainspring.create("emails", [1, "two", None], parent_id=parent["id"], process_in_ms=60_000, **fields)
        bulk = await mainspring.create_many("emails", [
            {"data": {"n": 1}, "message_id": "bulk-1", **fields},
            {"data": None, "completed": True, "result": {"ok": True}, "parent_id": parent["id"]},
        ])
        leased = (await leasing.lease(mainspring.store, cfg, "emails", "w", 1)).items
        assert [i["id"] for i in leased] == [parent["id"]]
        detail = {"type": "ValueError", "message": "no", "traceback": "Traceback …"}
        await leasing.release(mainspring.store, parent["id"], leased[0]["lease"]["token"], Fail("ValueError: no", detail=detail))
        failed = await mainspring.create("emails", {"to": "someone else"}, message_id="parent-1")
    assert failed["id"] == parent["id"] and failed["status"] == "failed" and failed["error_detail"] == detail
    for answer in (parent, child, *bulk, failed):
        assert answer == Interaction.model_validate(answer).model_dump(mode="json")
    assert child["status"] == "scheduled" and bulk[1]["status"] == "completed"
    assert bulk[0] == (await client.get(f"/v1/interactions/{bulk[0]['id']}")).json()  # the failed parent cancelled the others


async def test_a_produced_interaction_is_validated_like_a_request(database_url: str, tmp_path: Path) -> None:
    async with producer(database=database_url, data_dir=tmp_path) as mainspring:
        with pytest.raises(ValidationError):
            await mainspring.create("emails", data=float("nan"))
        with pytest.raises(ValidationError):
            await mainspring.create("emails", process_at="2027-01-01T00:00:00Z", process_in_ms=5)


async def test_a_produced_interaction_wakes_a_worker_in_another_store_at_once(database_url: str, tmp_path: Path) -> None:
    """The producer's commit wakes a waiting worker elsewhere (NOTIFY, or SQLite's wake-up sockets)
    long before its poll interval."""
    cfg = InteractionsSettings()
    worker_side = Store(database_url, clock=Clock(), pool_size=2)
    async with producer(database=database_url, data_dir=tmp_path) as mainspring:
        await worker_side.start()
        await worker_side.listening()
        try:
            waiting = asyncio.create_task(leasing.lease_wait(worker_side, cfg, "jobs", "w", 1, None, 30_000, poll_ms=60_000))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            item = await mainspring.create("jobs", data=1)
            taken = await asyncio.wait_for(waiting, 5)
        finally:
            await worker_side.close()
    assert [i["id"] for i in taken.items] == [item["id"]]


async def test_a_produced_task_is_accepted_and_its_duplicate_rejected(database_url: str, tmp_path: Path) -> None:
    async with producer(database=database_url, data_dir=tmp_path) as mainspring:
        task = await mainspring.submit("books", id="b1-en", group="b1", member="en", content="Chapter 1")
        again = await mainspring.submit("books", id="b1-en", group="b1", member="en", content="Chapter 1")
        duplicate = await mainspring.submit("books", id="b1-en-bis", group="b1", member="en", content="Chapter 1")
    assert (task["status"], task["version"]) == ("pending", 1)
    assert again["id"] == task["id"] and again["status"] == "pending"
    assert (duplicate["status"], duplicate["reason"]) == ("rejected", "duplicate")


async def test_a_produced_message_is_stored_once_per_key_and_readable_by_the_server(database_url: str, tmp_path: Path) -> None:
    from mainspring.core.errors import Conflict
    from mainspring.exchange import messages

    async with producer(database=database_url, data_dir=tmp_path) as mainspring:
        stored = await mainspring.put("erp", "main", b"<order id='17'/>", message_key="order-17", content_type="application/xml")
        again = await mainspring.put("erp", "main", b"<order id='17'/>", message_key="order-17")
        with pytest.raises(Conflict) as refused:
            await mainspring.put("erp", "main", b"<order id='18'/>", message_key="order-17")
        _, body = await messages.read_message(mainspring.context, "erp", "main", stored["id"])
    assert again["id"] == stored["id"] and stored["size"] == len(body) and body == b"<order id='17'/>"
    assert refused.value.code == "message_id_conflict"


async def test_a_produced_machine_call_commits_the_step_and_a_failure_raises_as_the_client_would(database_url: str, tmp_path: Path) -> None:
    from mainspring import App, MainspringError

    app = App()

    @app.processor("counters")
    def count(kind: str, args: object, machine: dict[str, object]) -> dict[str, object]:
        if args == "boom":
            raise RuntimeError("the processor failed")
        return {"events": [args], "response": len(machine["history"]) + 1}  # type: ignore[arg-type]

    async with producer(app, database=database_url, data_dir=tmp_path) as mainspring:
        started = await mainspring.start("counters", "c1", "first")
        assert await mainspring.call("counters", "c1", "second") == 2
        notification = await mainspring.notify("counters", "c1", "third")
        with pytest.raises(MainspringError) as failed:
            await mainspring.call("counters", "c1", "boom")
    assert started["id"] == "c1" and notification
    assert failed.value.status >= 500


async def test_a_producer_closes_its_connections_to_remote_processors(database_url: str, tmp_path: Path) -> None:
    from mainspring.machines.namespaces import HTTP_CLIENT, put_namespace
    from mainspring.machines.settings import NamespaceConfig, ProcessorConfig
    from tests.machines.conftest import FakeProcessor, serve_fake

    async with serve_fake(FakeProcessor()) as url:
        async with producer(database=database_url, data_dir=tmp_path) as mainspring:
            await put_namespace(mainspring.context, "remote", NamespaceConfig(processor=ProcessorConfig(url=url)))
            assert (await mainspring.start("remote", "m1", "hello"))["history"][0]["data"] == {"started": "hello"}
            transport = mainspring.context.extras[HTTP_CLIENT]
            assert transport.open
    assert not transport.open and HTTP_CLIENT not in mainspring.context.extras


def test_mainspring_producer_is_the_function_even_after_its_module_was_imported() -> None:
    import importlib

    importlib.import_module("mainspring.producer")
    from mainspring import producer
    from mainspring.producer import Producer

    assert callable(producer) and producer.__module__ == "mainspring.producer" and isinstance(Producer, type)

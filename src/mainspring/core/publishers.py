"""Publishers: copy the outbox to NATS JetStream, Kafka and webhooks — ordered, at least once.

Each publisher follows the outbox by ``position`` with its own durable cursor (table ``publisher_cursors``,
migration core_0002). A round leases the cursor (so one server at a time publishes for it), reads the next
batch, hands it to the sink in order, waits for the sink's acknowledgement, and only then moves the cursor,
fenced by the lease token. A crash between the sink's ack and the cursor write re-sends that batch once
more: at least once. NATS gets ``Nats-Msg-Id`` = the event id, so JetStream drops such a repeat itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import httpx

from mainspring.core import alerts, data, outbox
from mainspring.core.leases import new_token
from mainspring.core.runtime import Context, run_loop
from mainspring.core.settings import EventsSettings, KafkaSink, NatsSink, WebhookSink
from mainspring.store import Store
from mainspring.store.errors import STORE_ERRORS

if TYPE_CHECKING:
    import nats.aio.client
    from aiokafka import AIOKafkaProducer
    from nats.js import JetStreamContext

log = logging.getLogger("mainspring.publishers")


BATCH = 500
PRUNE_BATCH = 1000
LEASE_MS = 30_000


class Sink(Protocol):
    name: str

    async def publish(self, events: Sequence[outbox.EventView]) -> None:
        """Deliver ``events`` in order; return only when the sink has acknowledged every one."""

    async def close(self) -> None: ...


class WebhookPublisher:
    """POSTs ``{"events": [...]}`` batches; any 2xx acknowledges the batch. Signed with HMAC-SHA256 when a
    secret is set: header ``X-Mainspring-Signature: sha256=<hex of the body>``."""

    def __init__(self, config: WebhookSink, client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.name = "webhook:" + hashlib.sha256(config.url.encode()).hexdigest()[:16]
        self._client = client or httpx.AsyncClient(timeout=30)

    async def publish(self, events: Sequence[outbox.EventView]) -> None:
        body = json.dumps({"events": list(events)}, separators=(",", ":")).encode()
        headers = {"content-type": "application/json"}
        if self.config.secret:
            headers["X-Mainspring-Signature"] = "sha256=" + hmac.new(self.config.secret.encode(), body, hashlib.sha256).hexdigest()
        reply = await self._client.post(self.config.url, content=body, headers=headers)
        if not 200 <= reply.status_code < 300:
            raise RuntimeError(f"webhook {self.config.url} answered {reply.status_code}")

    async def close(self) -> None:
        await self._client.aclose()


class NatsPublisher:
    """Publishes each event to JetStream subject ``<prefix>.<event type>`` of stream ``<stream>``."""

    def __init__(self, config: NatsSink) -> None:
        self.config = config
        self.name = f"nats:{config.stream}"
        self._nc: nats.aio.client.Client | None = None
        self._js: JetStreamContext | None = None

    async def _connect(self) -> JetStreamContext:
        if self._js is None:
            import nats
            from nats.js.errors import BadRequestError

            self._nc = await nats.connect(self.config.url, max_reconnect_attempts=-1)
            self._js = self._nc.jetstream()
            try:
                await self._js.add_stream(name=self.config.stream, subjects=[f"{self.config.subject_prefix}.>"])
            except BadRequestError:
                pass  # The stream exists with settings an operator chose; publish into it as it is.
        return self._js

    async def publish(self, events: Sequence[outbox.EventView]) -> None:
        js = await self._connect()
        acks = [
            js.publish(
                f"{self.config.subject_prefix}.{event['type']}",
                json.dumps(event, separators=(",", ":")).encode(),
                stream=self.config.stream,
                headers={"Nats-Msg-Id": event["id"]},
            )
            for event in events
        ]
        # One at a time keeps the order on the stream; JetStream acks each before the next is sent.
        for ack in acks:
            await ack

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()
            self._nc = self._js = None


class KafkaPublisher:
    """Produces each event to ``topic`` keyed by its subject, so one subject's events stay in one partition
    in order; ``acks="all"``. aiokafka has one batch in flight per partition, so retries cannot reorder;
    the idempotent producer is left off because not every Kafka-protocol broker (tansu) implements it."""

    def __init__(self, config: KafkaSink) -> None:
        self.config = config
        self.name = f"kafka:{config.topic}"
        self._producer: AIOKafkaProducer | None = None

    async def _connect(self) -> AIOKafkaProducer:
        if self._producer is None:
            from aiokafka import AIOKafkaProducer

            producer = AIOKafkaProducer(bootstrap_servers=self.config.bootstrap_servers, acks="all", **self.config.producer_options())
            await producer.start()
            self._producer = producer
        return self._producer

    async def publish(self, events: Sequence[outbox.EventView]) -> None:
        producer = await self._connect()
        futures = []
        for event in events:
            key = f"{event['subject']['kind']}:{event['subject']['id']}".encode()
            futures.append(await producer.send(self.config.topic, json.dumps(event, separators=(",", ":")).encode(), key=key))
        await asyncio.gather(*futures)

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None


def sinks_from_settings(events: EventsSettings) -> list[Sink]:
    sinks: list[Sink] = []
    if events.nats is not None:
        sinks.append(NatsPublisher(events.nats))
    if events.kafka is not None:
        sinks.append(KafkaPublisher(events.kafka))
    sinks.extend(WebhookPublisher(w) for w in events.webhooks)
    return sinks


async def publish_once(store: Store, sink: Sink, token: str, types: Sequence[str] = (), batch: int = BATCH) -> int:
    """Publish the next batch after the sink's cursor; answer how many events it published."""
    async with store.transaction() as tx:
        position = await data.lease_cursor(tx, store, sink.name, token, store.now_ms(), LEASE_MS)
    if position is None:
        return 0
    events, next_position = await outbox.read_events(store, position, batch, types)
    if events:
        try:
            await sink.publish(events)
        except Exception as exc:
            async with store.transaction() as tx:
                await data.record_cursor_error(tx, sink.name, str(exc))
            raise
    if next_position != position:
        async with store.transaction() as tx:
            await data.advance_cursor(tx, sink.name, token, next_position, store.now_ms())
    return len(events)


async def cursor_position(store: Store, name: str) -> int | None:
    async with store.read() as conn:
        return await data.cursor_position(conn, name)


async def run_publisher(ctx: Context, sink: Sink, types: Sequence[str] | None = None) -> None:
    """Publish until the server stops, waking on every new event; ``types``: the event types it reads
    (None: the ``[events]`` setting)."""
    token = new_token()
    types = ctx.settings.events.types if types is None else types

    async def step() -> int | None:
        try:
            while await publish_once(ctx.store, sink, token, types) >= BATCH:
                pass
        except Exception as exc:
            # Once: an open alert on this publisher is not raised again (core.alerts); the loop retries. When the
            # store itself is down there is nowhere to write it: the loop's warning says so.
            with contextlib.suppress(*STORE_ERRORS):
                async with ctx.store.transaction() as tx:
                    await alerts.raise_alert(tx, "publisher_failing", "publisher", sink.name,
                                             f"{sink.name} cannot publish: {type(exc).__name__}: {exc}")
            raise
        return None

    try:
        await run_loop(ctx, f"publisher {sink.name}", step, channel=outbox.EVENTS_CHANNEL)
    finally:
        await sink.close()


async def prune_published_events(ctx: Context, more_publishers: Sequence[str] = ()) -> None:
    """Delete events past ``server.events_retention_ms`` that every configured publisher has passed (a
    background loop); a full batch comes back at once. Without a retention only the per-minute counts go. ``more_publishers``: the faces' own publishers."""
    retention = ctx.settings.server.events_retention_ms
    names = [sink.name for sink in sinks_from_settings(ctx.settings.events)] + list(more_publishers)

    async def step() -> int | None:
        if retention is None:
            # Events kept for ever; their per-minute counts are not (one row per minute and type would pile up).
            await outbox.prune_event_counts(ctx.store)
            return None
        deleted = await outbox.delete_events_before(ctx.store, ctx.now_ms() - retention, PRUNE_BATCH, names)
        return ctx.now_ms() if deleted >= PRUNE_BATCH else None

    await run_loop(ctx, "events-retention", step, channel="events-retention", poll_ms=ctx.settings.server.retention_interval_ms)


async def run_publishers(ctx: Context) -> None:
    """Every publisher the ``[events]`` settings configure, side by side (a background loop)."""
    sinks = sinks_from_settings(ctx.settings.events)
    if sinks:
        await asyncio.gather(*(run_publisher(ctx, sink) for sink in sinks))

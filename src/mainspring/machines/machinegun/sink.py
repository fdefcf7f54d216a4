"""Machinegun's event sink: each machine event to Kafka as a Thrift-binary ``SinkEvent``.

Consumers written for Machinegun's Kafka event sink read these records unchanged: the value is
``SinkEvent{event: MachineEvent{source_ns, source_id, event_id, created_at, format_version, data}}`` in the
Thrift binary protocol, the key is the machine id (so one machine's events stay in one partition, in order).
It reads the outbox's ``machine.event`` events with its own durable cursor, beside the JSON publishers
(``[events]``): at least once, in order per machine, never invented.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from mainspring.core.publishers import KafkaPublisher, run_publisher
from mainspring.core.runtime import Context
from mainspring.core.settings import KafkaSink
from mainspring.machines.machinegun import codec
from mainspring.machines.machinegun.idl import evsink, serialize
from mainspring.machines.settings import MachinegunSink

EVENT_TYPES = ("machine.event",)


def sink_event(event: dict[str, Any]) -> Any:
    """An outbox ``machine.event`` (as ``outbox.read_events`` answers it) as Machinegun's SinkEvent."""
    data = event["data"]
    version, value = codec.split_content(data["data"])
    machine_event = evsink.MachineEvent(
        source_ns=data["namespace"], source_id=data["id"], event_id=data["event_id"], created_at=event["at"],
        format_version=version, data=codec.value_from_json(value),
    )
    return evsink.SinkEvent(event=machine_event)


class ThriftKafkaSink(KafkaPublisher):
    """Produces a namespace's machine events to ``topic`` as Machinegun's SinkEvent records: core's Kafka
    publisher (``acks="all"``, one batch in flight per partition) with Machinegun's record format."""

    def __init__(self, config: MachinegunSink) -> None:
        super().__init__(KafkaSink(bootstrap_servers=config.bootstrap_servers, topic=config.topic))
        self.sink_config = config
        self.name = f"machinegun-kafka:{config.topic}"  # face.machinegun_publishers names it too (retention)

    def wants(self, event: dict[str, Any]) -> bool:
        namespaces = self.sink_config.namespaces
        return event["type"] in EVENT_TYPES and (not namespaces or event["data"]["namespace"] in namespaces)

    async def publish(self, events: Sequence[dict[str, Any]]) -> None:
        wanted = [e for e in events if self.wants(e)]
        if not wanted:
            return
        producer = await self._connect()
        futures = [await producer.send(self.config.topic, serialize(sink_event(e)), key=e["data"]["id"].encode()) for e in wanted]
        await asyncio.gather(*futures)


async def run_machinegun_sinks(ctx: Context) -> None:
    """Every ``machines.machinegun.sinks`` entry, side by side, until the server stops."""
    sinks = [ThriftKafkaSink(config) for config in ctx.settings.machines.machinegun.sinks]
    if sinks:
        await asyncio.gather(*(run_publisher(ctx, sink, EVENT_TYPES) for sink in sinks))

"""Machinegun's event sink: each machine event to Kafka as a Thrift-binary ``SinkEvent``.

Consumers written for Machinegun's Kafka event sink read these records unchanged: the value is
``SinkEvent{event: MachineEvent{source_ns, source_id, event_id, created_at, format_version, data}}`` in the
Thrift binary protocol, the key is ``"<ns> <id>"`` and the partition ``erlang:phash2(Key) rem Partitions``, as
Machinegun's (brod's ``hash`` partitioner): one machine's events stay in the partition they went to under
Machinegun, in order, across a cutover.
It reads the outbox's ``machine.event`` events with its own durable cursor, beside the JSON publishers
(``[events]``): at least once, in order per machine, never invented.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict, cast

from mainspring.core import outbox
from mainspring.core.publishers import KafkaPublisher, run_publisher
from mainspring.core.runtime import Context
from mainspring.core.settings import KafkaSink
from mainspring.machines.machinegun import codec
from mainspring.machines.machinegun.idl import evsink, serialize, stateproc
from mainspring.machines.machinegun.phash2 import machinegun_partition
from mainspring.machines.settings import MachinegunSink
from mainspring.types import JsonData

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer

EVENT_TYPES = ("machine.event",)


class MachineEventData(TypedDict):
    """A ``machine.event``'s data, as ``steps.event_of_each`` writes it."""

    namespace: str
    id: str
    event_id: int
    data: JsonData


def _machine_event(event: outbox.EventView) -> MachineEventData:
    return cast(MachineEventData, event["data"])  # a machine.event's, as written


def sink_event(event: outbox.EventView) -> object:
    """An outbox ``machine.event`` (as ``outbox.read_events`` answers it) as Machinegun's SinkEvent."""
    data = _machine_event(event)
    version, value = codec.split_content(data["data"])
    machine_event = evsink.MachineEvent(
        source_ns=data["namespace"], source_id=data["id"], event_id=data["event_id"], created_at=event["at"],
        format_version=version, data=codec.value_from_json(value),
    )
    return evsink.SinkEvent(event=machine_event)


async def sink_history(ctx: Context, namespaces: Sequence[str], after: int, limit: int) -> list[object]:
    """Machinegun's polling sink: up to ``limit`` machine events of ``namespaces`` (empty: all) after outbox
    position ``after``, oldest first, as ``state_processing.SinkEvent``s whose id is the position."""
    found: list[object] = []
    wanted = set(namespaces)
    while len(found) < limit:
        events, cursor = await outbox.read_events(ctx.store, after, max(100, limit - len(found)), EVENT_TYPES)
        for event in events:
            data = _machine_event(event)
            if wanted and data["namespace"] not in wanted:
                continue
            version, value = codec.split_content(data["data"])
            found.append(stateproc.SinkEvent(
                id=int(event["id"]), source_id=data["id"], source_ns=data["namespace"],
                event=stateproc.Event(id=data["event_id"], created_at=event["at"], format_version=version, data=codec.value_from_json(value)),
            ))
            if len(found) == limit:
                break
        if not events or cursor == after:
            break
        after = cursor
    return found


def record_key(namespace: str, machine_id: str) -> bytes:
    """Machinegun's Kafka record key of a machine's events: ``<<NS/binary, " ", ID/binary>>``."""
    return f"{namespace} {machine_id}".encode()


def partition_of(key: bytes, all_partitions: Sequence[int], available: Sequence[int]) -> int:
    """aiokafka's partitioner hook, as brod's ``hash``: by the key alone, among all the topic's partitions
    (not only the available ones, or a machine would change partition while one is down)."""
    partitions = sorted(all_partitions)
    return partitions[machinegun_partition(key, len(partitions))]


class ThriftKafkaSink(KafkaPublisher):
    """Produces a namespace's machine events to ``topic`` as Machinegun's SinkEvent records: core's Kafka
    publisher (``acks="all"``, one batch in flight per partition) with Machinegun's record format."""

    def __init__(self, config: MachinegunSink) -> None:
        super().__init__(KafkaSink(**config.model_dump(exclude={"namespaces"})))
        self.sink_config = config
        self.name = f"machinegun-kafka:{config.topic}"  # face.machinegun_publishers names it too (retention)

    async def _connect(self) -> AIOKafkaProducer:
        if self._producer is None:
            from aiokafka import AIOKafkaProducer

            producer = AIOKafkaProducer(bootstrap_servers=self.config.bootstrap_servers, acks="all", partitioner=partition_of,
                                        **self.config.producer_options())
            await producer.start()
            self._producer = producer
        return self._producer

    def wants(self, event: outbox.EventView) -> bool:
        namespaces = self.sink_config.namespaces
        return event["type"] in EVENT_TYPES and (not namespaces or _machine_event(event)["namespace"] in namespaces)

    async def publish(self, events: Sequence[outbox.EventView]) -> None:
        wanted = [e for e in events if self.wants(e)]
        if not wanted:
            return
        producer = await self._connect()
        futures = [await producer.send(self.config.topic, serialize(sink_event(e)), key=record_key(_machine_event(e)["namespace"], _machine_event(e)["id"]))
                   for e in wanted]
        await asyncio.gather(*futures)


async def run_machinegun_sinks(ctx: Context) -> None:
    """Every ``machines.machinegun.sinks`` entry, side by side, until the server stops."""
    sinks = [ThriftKafkaSink(config) for config in ctx.settings.machines.machinegun.sinks]
    if sinks:
        await asyncio.gather(*(run_publisher(ctx, sink, EVENT_TYPES) for sink in sinks))

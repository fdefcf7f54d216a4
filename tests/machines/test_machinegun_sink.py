"""Machinegun's event sink (machinegun/sink.py): machine events on Kafka (the real ``tansu`` broker) as
Thrift-binary ``SinkEvent`` records that decode with the project's IDL, one namespace per topic."""

from __future__ import annotations

import httpx

from mainspring.app import App, Registration
from mainspring.core import outbox
from mainspring.core.publishers import cursor_position, publish_once
from mainspring.machines.machinegun.idl import deserialize, evsink
from mainspring.machines.machinegun.sink import EVENT_TYPES, ThriftKafkaSink
from mainspring.machines.settings import MachinegunSink
from mainspring.store import Store
from tests.machines.conftest import FakeProcessor
from tests.machines.machinegun import AutomatonClient, V, desc, s
from tests.machines.test_publishers import create_topic
from tests.machines.test_publishers import kafka_broker as kafka_broker  # the tansu broker fixture


async def test_machine_events_decode_as_sink_events(client: httpx.AsyncClient, store: Store, registry: App, kafka_broker: str) -> None:
    from aiokafka import AIOKafkaConsumer

    for ns in ("invoices", "other"):
        processor = FakeProcessor()
        processor.on("init", lambda a, m: {"events": [{"$fv": 3, "$data": {"$bin": "AAE="}}, {"issued": a}]})
        registry.processors[ns] = Registration(processor)
    mg = AutomatonClient(client)
    await mg.Start("invoices", "inv-1", V(i=5))
    await mg.Start("other", "o-1", V(i=6))
    await mg.Call(desc("invoices", "inv-1"), s("pay"))
    await outbox.assign_positions(store)

    topic = await create_topic(kafka_broker, "mg")
    sink = ThriftKafkaSink(MachinegunSink(bootstrap_servers=kafka_broker, topic=topic, namespaces=["invoices"]))
    try:
        while await publish_once(store, sink, "t", EVENT_TYPES):
            pass
    finally:
        await sink.close()
    assert await cursor_position(store, sink.name)

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_broker, auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        records = []
        while len(records) < 3:
            batches = await consumer.getmany(timeout_ms=5000)
            if not batches:
                break
            for got in batches.values():
                records.extend(got)
    finally:
        await consumer.stop()
    events = [deserialize(evsink.SinkEvent(), r.value).event for r in records]
    assert [(e.source_ns, e.source_id, e.event_id) for e in events] == [("invoices", "inv-1", 1), ("invoices", "inv-1", 2), ("invoices", "inv-1", 3)]
    assert {r.key for r in records} == {b"inv-1"}
    assert events[0].format_version == 3 and events[0].data == V(bin=b"\x00\x01")
    assert events[1].format_version is None and events[1].data == V(obj={s("issued"): V(i=5)})
    assert events[2].data == V(obj={s("called"): s("pay")}) and events[2].created_at.endswith("Z")


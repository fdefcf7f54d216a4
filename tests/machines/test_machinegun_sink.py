"""Machinegun's event sink (machinegun/sink.py): machine events on Kafka (the real ``tansu`` broker) as
Thrift-binary ``SinkEvent`` records that decode with the project's IDL, one namespace per topic, keyed and
partitioned as Machinegun's (``erlang:phash2``, checked against vectors from a real ``erl``)."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mainspring.app import App, Registration
from mainspring.core import outbox
from mainspring.core.publishers import cursor_position, publish_once
from mainspring.machines.machinegun.idl import deserialize, evsink
from mainspring.machines.machinegun.phash2 import machinegun_partition, phash2
from mainspring.machines.machinegun.sink import EVENT_TYPES, ThriftKafkaSink, partition_of, record_key
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

    topic = await create_topic(kafka_broker, "mg", partitions=4)
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
    # Machinegun's key and partition: "<ns> <id>", erlang:phash2(Key) rem 4 (47695065 rem 4 = 1, from erl).
    assert {(r.key, r.partition) for r in records} == {(b"invoices inv-1", 1)}
    assert events[0].format_version == 3 and events[0].data == V(bin=b"\x00\x01")
    assert events[1].format_version is None and events[1].data == V(obj={s("issued"): V(i=5)})
    assert events[2].data == V(obj={s("called"): s("pay")}) and events[2].created_at.endswith("Z")



# erlang:phash2(Key) printed by erl (OTP 25, erts 13.1.5); phash2 is stable across Erlang releases.
PHASH2_VECTORS = [
    (b"", 13708901), (b"a", 112802447), (b"invoices inv-1", 47695065), (b"ff/withdrawal/session_v2 1234567/1", 83368831),
    (b"ns id", 9776574), (b"abcdefghijkl", 15432855), (b"abcdefghijklm", 11441572),
    ("invoice Ёчёт".encode(), 94812048), (b"x" * 100, 131552894), (bytes([0, 255, 128]), 88930461),
]


@pytest.mark.parametrize(("key", "expected"), PHASH2_VECTORS)
def test_phash2_matches_erlang(key: bytes, expected: int) -> None:
    assert phash2(key) == expected
    assert machinegun_partition(key, 10) == expected % 10


@pytest.mark.skipif(shutil.which("erl") is None, reason="no Erlang (Debian's erlang-base) installed")
@settings(max_examples=1, deadline=None)
@given(keys=st.lists(st.binary(max_size=80), min_size=50, max_size=50))
def test_phash2_matches_a_real_erl_on_generated_keys(keys: list[bytes]) -> None:
    terms = ",".join("<<" + ",".join(map(str, key)) + ">>" for key in keys)
    script = f"io:format(\"~w\", [[erlang:phash2(K) || K <- [{terms}]]]), halt()."
    printed = subprocess.run(["erl", "-noshell", "-eval", script], capture_output=True, text=True, timeout=60, check=True).stdout
    assert [int(n) for n in printed.strip("[]\n").split(",")] == [phash2(key) for key in keys]


def test_the_partitioner_uses_every_partition_not_only_the_available_ones() -> None:
    key = record_key("invoices", "inv-1")
    assert key == b"invoices inv-1"
    assert partition_of(key, [3, 1, 0, 2], [0]) == 47695065 % 4

"""Machinegun's Automaton over woody (machinegun/automaton.py): every method and every exception the IDL
declares, driven by a Thrift client built from the project's IDL, in-process and against a real server."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mainspring.machines.machinegun import woody
from mainspring.machines.machinegun.idl import msgpack, stateproc
from mainspring.machines.processor import Unprocessable
from tests.machines.conftest import NS, FakeProcessor, eventually, serve_fake
from tests.machines.machinegun import NIL, PATH, AutomatonClient, V, desc, s

pytestmark = pytest.mark.usefixtures("fake")


async def test_every_method_and_declared_exception(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    mg = AutomatonClient(client)
    args = V(obj={s("amount"): V(i=100), s("blob"): V(bin=b"\x00\xff\x10"), V(i=7): V(arr=[V(flt=1.0), NIL, V(b=True)])})

    with pytest.raises(stateproc.NamespaceNotFound):
        await mg.Start("nowhere", "m1", args)
    assert mg.last.headers[woody.ERROR_CLASS] == "Business Error" and mg.last.headers[woody.ERROR_REASON] == "NamespaceNotFound"
    assert await mg.Start(NS, "m1", args) is None
    assert fake.calls[-1][1] == {"$map": [["amount", 100], ["blob", {"$bin": "AP8Q"}], [7, [1.0, None, True]]]}
    with pytest.raises(stateproc.MachineAlreadyExists):
        await mg.Start(NS, "m1", args)

    # Call: the processor's response comes back as the same Value, binary included.
    fake.on("call", lambda a, m: {"events": [{"called": a}], "response": a})
    assert await mg.Call(desc(NS, "m1"), args) == args
    fake.on("call", lambda a, m: {"events": [], "response": len(m["history"])})
    assert await mg.Call(desc(NS, "m1", after=1, limit=5), NIL) == V(i=1)  # the range reached the processor
    with pytest.raises(stateproc.MachineNotFound):
        await mg.Call(desc(NS, "nope"), NIL)
    with pytest.raises(stateproc.NamespaceNotFound):
        await mg.Call(desc("nowhere", "m1"), NIL)

    machine = await mg.GetMachine(desc(NS, "m1"))
    assert [e.id for e in machine.history] == [1, 2] and machine.status.working is not None
    assert machine.history[1].data == V(obj={s("called"): args})
    assert machine.aux_state.data == V(obj={s("n"): V(i=0)})
    backward = await mg.GetMachine(desc(NS, "m1", limit=1, backward=True))
    assert [e.id for e in backward.history] == [2] and backward.history_range.direction == stateproc.Direction.backward
    assert (await mg.GetMachine(desc(NS, "m1", after=1))).history[0].id == 2
    assert (await mg.GetMachine(desc(NS, "m1", limit=0))).history == []
    assert (await mg.GetMachine(desc(NS, "m1", after=99))).history == []  # past the end: empty, as Machinegun
    with pytest.raises(stateproc.MachineNotFound):
        await mg.GetMachine(desc(NS, "nope"))

    response = await mg.Notify(desc(NS, "m1"), s("ping"))
    assert isinstance(response, stateproc.NotifyResponse) and response.id
    await eventually(lambda: _has_event(mg, {"notified": "ping"}), what="the notification's event")
    with pytest.raises(stateproc.MachineNotFound):
        await mg.Notify(desc(NS, "nope"), NIL)

    with pytest.raises(stateproc.MachineAlreadyWorking):
        await mg.SimpleRepair(NS, stateproc.Reference(id="m1"))
    with pytest.raises(stateproc.MachineAlreadyWorking):
        await mg.Repair(desc(NS, "m1"), NIL)

    # A processor refusing a call fails the machine: MachineFailed, now and on the next Call.
    fake.on("call", _refuse)
    with pytest.raises(stateproc.MachineFailed):
        await mg.Call(desc(NS, "m1"), NIL)
    with pytest.raises(stateproc.MachineFailed):
        await mg.Call(desc(NS, "m1"), NIL)
    failed = await mg.GetMachine(desc(NS, "m1"))
    assert failed.status.failed is not None and "no" in failed.status.failed.reason
    with pytest.raises(stateproc.MachineNotFound):
        await mg.SimpleRepair(NS, stateproc.Reference(id="nope"))
    fake.on("repair", lambda a, m: {"events": [{"repaired": a}], "response": {"ok": a}})
    assert await mg.Repair(desc(NS, "m1"), s("fix")) == V(obj={s("ok"): s("fix")})
    fake.on("call", _refuse)
    with pytest.raises(stateproc.MachineFailed):
        await mg.Call(desc(NS, "m1"), NIL)
    assert await mg.SimpleRepair(NS, stateproc.Reference(id="m1")) is None
    assert (await mg.GetMachine(desc(NS, "m1"))).status.working is not None

    # An init the processor refuses: MachineFailed, and nothing is created.
    fake.on("init", _refuse)
    with pytest.raises(stateproc.MachineFailed):
        await mg.Start(NS, "m2", NIL)
    with pytest.raises(stateproc.MachineNotFound):
        await mg.GetMachine(desc(NS, "m2"))

    with pytest.raises(stateproc.NamespaceNotFound):  # no Modernizer configured, as Machinegun answers it
        await mg.Modernize(desc(NS, "m1"))
    with pytest.raises(stateproc.NamespaceNotFound):
        await mg.Modernize(desc("nowhere", "m1"))

    assert await mg.Remove(NS, "m1") is None
    with pytest.raises(stateproc.MachineNotFound):
        await mg.Remove(NS, "m1")
    with pytest.raises(stateproc.NamespaceNotFound):
        await mg.Remove("nowhere", "m1")


def _refuse(args: Any, machine: dict[str, Any]) -> Any:
    raise Unprocessable("no")


async def _has_event(mg: AutomatonClient, data: dict[str, Any]) -> bool:
    from mainspring.machines.machinegun.codec import value_to_json

    machine = await mg.GetMachine(desc(NS, "m1"))
    return any(value_to_json(e.data) == data for e in machine.history)


async def test_woody_system_errors(client: httpx.AsyncClient, fake: FakeProcessor) -> None:
    mg = AutomatonClient(client)
    await mg.Start(NS, "m1", NIL)
    body = woody.encode_call(stateproc.Automaton, "GetMachine", {"desc": desc(NS, "m1")})
    ids = woody.root_trace().headers()
    wrong_type = await client.post(PATH, content=body, headers={"content-type": "application/json", **ids})
    assert wrong_type.status_code == 415 and wrong_type.headers[woody.ERROR_CLASS] == "Result Unexpected"
    no_ids = await client.post(PATH, content=body, headers={"content-type": woody.CONTENT_TYPE})
    assert no_ids.status_code == 400 and no_ids.headers["x-rbk-error-class"] == "Result Unexpected"
    garbage = await client.post(PATH, content=b"\x80\x01\x00\x01garbage", headers={"content-type": woody.CONTENT_TYPE, **ids})
    assert garbage.status_code == 400
    passed = await client.post(PATH, content=body, headers={"content-type": woody.CONTENT_TYPE, woody.DEADLINE: "2001-01-01T00:00:00.000Z", **ids})
    assert passed.status_code == 503 and passed.headers[woody.ERROR_CLASS] == "Resource Unavailable"
    ok = await client.post(PATH, content=body, headers={"content-type": woody.CONTENT_TYPE, **ids})
    assert ok.status_code == 200 and ok.headers["content-type"] == woody.CONTENT_TYPE
    assert ok.headers[woody.TRACE_ID] == ids[woody.TRACE_ID]  # the trace headers are echoed, as woody does

    # A processor that fails transiently (not a refusal) is "Resource Unavailable": 503, as Machinegun answers.
    def broken(args: Any, machine: dict[str, Any]) -> Any:
        raise RuntimeError("down")

    fake.on("call", broken)
    with pytest.raises(woody.WoodyError) as failed:
        await mg.Call(desc(NS, "m1"), NIL)
    assert (failed.value.status, failed.value.error_class) == (503, "Resource Unavailable")
    assert (await mg.GetMachine(desc(NS, "m1"))).status.working is not None  # a transient error fails nothing


@pytest.mark.slow
async def test_a_real_server_serves_the_automaton(servers: Any) -> None:
    (server,) = servers(1)
    processor = FakeProcessor()
    async with serve_fake(processor) as processor_url, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        put = await http.put(f"/v1/namespaces/{NS}", json={"processor": {"url": processor_url, "timeout_ms": 5000}})
        assert put.status_code == 200
        mg = AutomatonClient(http)
        await mg.Start(NS, "real", V(bin=b"\x01\x02"))
        assert processor.calls[0][1] == {"$bin": "AQI="}
        assert await mg.Call(desc(NS, "real"), s("hi")) == V(obj={s("echo"): s("hi")})
        machine = await mg.GetMachine(desc(NS, "real"))
        assert [e.data for e in machine.history] == [V(obj={s("started"): V(bin=b"\x01\x02")}), V(obj={s("called"): s("hi")})]
        with pytest.raises(stateproc.MachineAlreadyExists):
            await mg.Start(NS, "real", NIL)
        assert isinstance(msgpack.Nil(), msgpack.Nil)

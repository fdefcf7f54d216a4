"""Machinegun's real clients (hellgate, fistful, machinery over woody_erlang) work unchanged: their ids,
ranges, deadlines and headers are answered as Machinegun answers them (issue 25)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from mainspring.app import App, Registration
from mainspring.config import Settings, load_settings
from mainspring.machines.machinegun import woody
from mainspring.machines.machinegun.idl import stateproc
from mainspring.machines.processor import Unprocessable
from mainspring.store import ManualClock, Store
from tests.conftest import free_port
from tests.machines.conftest import FakeProcessor, eventually, serve_app
from tests.machines.machinegun import (
    NIL,
    AutomatonClient,
    V,
    desc,
    s,
    woody_erlang_headers,
    woody_processor_app,
)

FISTFUL_NS = "ff/withdrawal/session_v2"


@pytest.fixture
def fistful(registry: App) -> FakeProcessor:
    processor = FakeProcessor()
    registry.processors[FISTFUL_NS] = Registration(processor)
    return processor


async def test_fistful_namespaces_and_ids_with_slashes_and_non_ascii_work_over_thrift_and_json(
    client: httpx.AsyncClient, fistful: FakeProcessor
) -> None:
    mg = AutomatonClient(client, headers=woody_erlang_headers())
    session = "1234567/1"  # fistful's <<ID, "/", SubID>>
    await mg.Start(FISTFUL_NS, session, s("go"))
    assert [e.id for e in (await mg.GetMachine(desc(FISTFUL_NS, session))).history] == [1]
    assert await mg.Call(desc(FISTFUL_NS, session), s("x")) == V(obj={s("echo"): s("x")})
    unicode_id = "счёт №1 ✓"
    await mg.Start(FISTFUL_NS, unicode_id, NIL)
    longest = "i" * 1024  # 1 KiB of UTF-8
    await mg.Start(FISTFUL_NS, longest, NIL)

    # The JSON API reaches the same machines with each id as one percent-encoded path segment.
    for machine_id in (session, unicode_id, longest):
        got = await client.get(f"/v1/namespaces/{quote(FISTFUL_NS, safe='')}/machines/{quote(machine_id, safe='')}")
        assert got.status_code == 200, got.text
        assert (got.json()["namespace"], got.json()["id"]) == (FISTFUL_NS, machine_id)
    call = await client.post(f"/v1/namespaces/{quote(FISTFUL_NS, safe='')}/machines/{quote(session, safe='')}/call", json={"args": 1})
    assert call.status_code == 200 and call.json()["response"] == {"echo": 1}
    started = await client.post(f"/v1/namespaces/{quote(FISTFUL_NS, safe='')}/machines", json={"id": "ünï/2", "args": None})
    assert started.status_code == 201, started.text
    assert (await mg.GetMachine(desc(FISTFUL_NS, "ünï/2"))).id == "ünï/2"
    listed = await client.get(f"/v1/namespaces/{quote(FISTFUL_NS, safe='')}/machines", params={"limit": 2})
    assert listed.status_code == 200 and listed.json()["next_cursor"]
    rest = await client.get(f"/v1/namespaces/{quote(FISTFUL_NS, safe='')}/machines", params={"limit": 10, "cursor": listed.json()["next_cursor"]})
    assert rest.status_code == 200 and len(listed.json()["machines"]) + len(rest.json()["machines"]) == 4


async def test_ids_past_one_kib_or_empty_or_with_nul_are_refused_and_change_nothing(client: httpx.AsyncClient, fistful: FakeProcessor) -> None:
    mg = AutomatonClient(client)
    for bad in ("i" * 1025, "é" * 513, "", "a\x00b"):
        with pytest.raises(woody.WoodyError) as refused:
            await mg.Start(FISTFUL_NS, bad, NIL)
        assert (refused.value.status, refused.value.error_class) == (400, "Result Unexpected")
    json_refused = await client.post(f"/v1/namespaces/{quote(FISTFUL_NS, safe='')}/machines", json={"id": "i" * 1025})
    assert json_refused.status_code == 422
    path_refused = await client.get(f"/v1/namespaces/{quote(FISTFUL_NS, safe='')}/machines/{'i' * 1025}")
    assert path_refused.status_code == 422
    assert fistful.calls == []
    assert (await client.get(f"/v1/namespaces/{quote(FISTFUL_NS, safe='')}/machines")).json()["machines"] == []


async def test_get_machine_after_the_last_event_answers_an_empty_history(client: httpx.AsyncClient, fistful: FakeProcessor) -> None:
    fistful.on("init", lambda a, m: {"events": []})
    mg = AutomatonClient(client)
    await mg.Start(FISTFUL_NS, "empty", NIL)
    assert (await mg.GetMachine(desc(FISTFUL_NS, "empty", after=0))).history == []
    fistful.on("init", lambda a, m: {"events": ["one", "two"]})
    await mg.Start(FISTFUL_NS, "two", NIL)
    assert (await mg.GetMachine(desc(FISTFUL_NS, "two", after=2))).history == []
    assert (await mg.GetMachine(desc(FISTFUL_NS, "two", after=99, limit=10))).history == []
    assert [e.id for e in (await mg.GetMachine(desc(FISTFUL_NS, "two", after=1))).history] == [2]


async def test_an_unreachable_processor_is_503_and_a_slow_one_504(client: httpx.AsyncClient, registry: App) -> None:
    async def slow(kind: str, args: Any, machine: dict[str, Any]) -> Any:
        await asyncio.sleep(5)

    nowhere = f"http://127.0.0.1:{free_port()}/"
    put = await client.put("/v1/namespaces/down", json={"processor": {"url": nowhere, "timeout_ms": 2000}})
    assert put.status_code == 200
    registry.processors["slow"] = Registration(slow)
    assert (await client.put("/v1/namespaces/slow", json={"processor": {"timeout_ms": 200}})).status_code == 200
    mg = AutomatonClient(client)
    with pytest.raises(woody.WoodyError) as unavailable:
        await mg.Start("down", "m", NIL)
    assert (unavailable.value.status, unavailable.value.error_class) == (503, "Resource Unavailable")
    with pytest.raises(woody.WoodyError) as unknown:
        await mg.Start("slow", "m", NIL)
    assert (unknown.value.status, unknown.value.error_class) == (504, "Result Unknown")


TOKEN = "ms_machines_token"


def _with_tokens(database_url: str, tmp_path: Path, **machinegun: Any) -> Settings:
    token = {"token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest(), "scopes": ["machines:*"], "name": "machines"}
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 200, "sqlite_synchronous": "NORMAL"},
        auth={"tokens": [token]}, machines={"machinegun": machinegun},
    )


class TestAuthNone:
    @pytest.fixture
    def settings(self, database_url: str, tmp_path: Path) -> Settings:
        return _with_tokens(database_url, tmp_path, auth="none")

    async def test_a_woody_client_without_a_token_calls_when_auth_is_none(self, client: httpx.AsyncClient, fistful: FakeProcessor) -> None:
        mg = AutomatonClient(client, headers=woody_erlang_headers({"user-identity.id": "u1"}))
        await mg.Start(FISTFUL_NS, "m", s("go"))
        assert (await mg.GetMachine(desc(FISTFUL_NS, "m"))).id == "m"
        # The JSON API still needs its token.
        assert (await client.get(f"/v1/namespaces/{quote(FISTFUL_NS, safe='')}/machines/m")).status_code == 401


class TestAuthToken:
    @pytest.fixture
    def settings(self, database_url: str, tmp_path: Path) -> Settings:
        return _with_tokens(database_url, tmp_path)

    async def test_with_tokens_configured_a_woody_client_needs_one_by_default(self, client: httpx.AsyncClient, fistful: FakeProcessor) -> None:
        mg = AutomatonClient(client, headers=woody_erlang_headers())
        with pytest.raises(woody.WoodyError) as refused:
            await mg.Start(FISTFUL_NS, "m", s("go"))
        assert refused.value.status == 401
        assert fistful.calls == []
        authorized = AutomatonClient(client, headers={"authorization": f"Bearer {TOKEN}"})
        await authorized.Start(FISTFUL_NS, "m", s("go"))


async def test_woody_deadline_bounds_start_repair_and_nothing_is_written_after_it(
    client: httpx.AsyncClient, fistful: FakeProcessor, clock: ManualClock
) -> None:
    """A client whose deadline passed does not find its Start done when it retries (no MachineAlreadyExists)."""

    async def slow(args: Any, machine: dict[str, Any]) -> Any:
        await asyncio.sleep(1.5)
        return {"events": ["late"]}

    mg = AutomatonClient(client, now_ms=clock.now_ms, deadline_ms=300)
    fistful.on("init", slow)
    started = asyncio.get_running_loop().time()
    with pytest.raises(woody.WoodyError) as timed_out:
        await mg.Start(FISTFUL_NS, "m", NIL)
    assert (timed_out.value.status, timed_out.value.error_class) == (504, "Result Unknown")
    assert asyncio.get_running_loop().time() - started < 1.2  # the deadline, not the namespace's 30 s
    await asyncio.sleep(1.5)
    with pytest.raises(stateproc.MachineNotFound):
        await mg.GetMachine(desc(FISTFUL_NS, "m"))

    # A processor that answers in time, but after the caller's deadline: its answer is not written.
    def past_the_deadline(args: Any, machine: dict[str, Any]) -> Any:
        clock.advance(1_000)
        return {"events": ["too late"]}

    fistful.on("init", past_the_deadline)
    with pytest.raises(woody.WoodyError) as late:
        await mg.Start(FISTFUL_NS, "m", NIL)
    assert (late.value.status, late.value.error_class) == (504, "Result Unknown")
    with pytest.raises(stateproc.MachineNotFound):
        await mg.GetMachine(desc(FISTFUL_NS, "m"))

    fistful.on("init", lambda a, m: {"events": ["ok"]})
    await mg.Start(FISTFUL_NS, "m", NIL)  # the retry starts it, as it would have without the timeout
    fistful.on("call", lambda a, m: (_ for _ in ()).throw(Unprocessable("broken")))
    with pytest.raises(stateproc.MachineFailed):
        await mg.Call(desc(FISTFUL_NS, "m"), NIL)
    fistful.on("repair", slow)
    with pytest.raises(woody.WoodyError) as repair_timed_out:
        await mg.Repair(desc(FISTFUL_NS, "m"), NIL)
    assert repair_timed_out.value.status == 504
    await asyncio.sleep(1.5)
    assert (await mg.GetMachine(desc(FISTFUL_NS, "m"))).status.failed is not None  # the late repair wrote nothing


async def test_woody_meta_and_trace_reach_a_machinegun_processor(client: httpx.AsyncClient) -> None:
    handler = Recorder()
    async with serve_app(woody_processor_app(handler)) as url:
        put = await client.put("/v1/namespaces/traced", json={"processor": {"url": url, "protocol": "machinegun"}})
        assert put.status_code == 200
        mg = AutomatonClient(client, headers=woody_erlang_headers({"user-identity.id": "u-42", "user-identity.realm": "external"}))
        await mg.Start("traced", "m", NIL)
        await mg.Call(desc("traced", "m"), NIL)
    caller_spans = [mg.last.headers[woody.SPAN_ID]]
    for request in handler.requests:
        assert request[woody.TRACE_ID] == mg.trace.trace_id  # one trace, the caller's
        assert request["woody.meta.user-identity.id"] == "u-42" and request["woody.meta.user-identity.realm"] == "external"
        assert request[woody.PARENT_ID] != "undefined" and request[woody.SPAN_ID] not in caller_spans
    assert handler.requests[-1][woody.PARENT_ID] == caller_spans[0]  # the processor call is a child of the Call


class Recorder:
    """A Machinegun processor that answers every signal and call with nothing to do."""

    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []

    def ProcessSignal(self, a: Any) -> Any:
        return stateproc.SignalResult(change=stateproc.MachineStateChange(events=[]), action=stateproc.ComplexAction())

    def ProcessCall(self, a: Any) -> Any:
        return stateproc.CallResult(response=NIL, change=stateproc.MachineStateChange(events=[]), action=stateproc.ComplexAction())


class Modernizer:
    """Rewrites every event it is sent to format version 3, keeping its data under ``"v3"``; hands back
    unchanged what it does not know (``"keep"``)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []
        self.seen: list[Any] = []

    def ModernizeEvent(self, ev: Any) -> Any:
        self.seen.append(ev)
        if ev.event.data == s("keep"):
            return stateproc.ModernizeEventResult(event_payload=stateproc.Content(format_version=ev.event.format_version, data=s("changed?")))
        return stateproc.ModernizeEventResult(event_payload=stateproc.Content(format_version=3, data=V(obj={s("v3"): ev.event.data})))


async def test_modernize_calls_the_namespaces_modernizer_for_outdated_events(client: httpx.AsyncClient, fistful: FakeProcessor) -> None:
    fistful.on("init", lambda a, m: {"events": [{"$fv": 1, "$data": "old"}, "unversioned", {"$fv": 3, "$data": "new"}, {"$fv": 2, "$data": "keep"}]})
    mg = AutomatonClient(client)
    await mg.Start(FISTFUL_NS, "m", NIL)
    with pytest.raises(stateproc.NamespaceNotFound):  # no Modernizer configured
        await mg.Modernize(desc(FISTFUL_NS, "m"))

    modernizer = Modernizer()
    async with serve_app(woody_processor_app(modernizer, stateproc.Modernizer)) as url:
        namespace = {"modernizer": {"current_format_version": 3, "url": url, "timeout_ms": 5000}}
        assert (await client.put(f"/v1/namespaces/{quote(FISTFUL_NS, safe='')}", json=namespace)).status_code == 200
        assert await mg.Modernize(desc(FISTFUL_NS, "m")) is None
        with pytest.raises(stateproc.MachineNotFound):
            await mg.Modernize(desc(FISTFUL_NS, "nope"))
    assert [(e.ns, e.id, e.event.id, e.event.format_version) for e in modernizer.seen] == [
        (FISTFUL_NS, "m", 1, 1), (FISTFUL_NS, "m", 2, None), (FISTFUL_NS, "m", 4, 2)]  # event 3 is current
    history = (await mg.GetMachine(desc(FISTFUL_NS, "m"))).history
    assert [(e.format_version, e.data) for e in history] == [
        (3, V(obj={s("v3"): s("old")})), (3, V(obj={s("v3"): s("unversioned")})), (3, s("new")), (2, s("keep"))]
    events = (await client.get("/v1/events", params={"limit": 100})).json()["events"]
    assert [e["data"]["event_id"] for e in events if e["type"] == "machine.event_modernized"] == [1, 2]


async def test_a_store_outage_during_start_is_retried_inside_and_answered_once_the_store_is_back(
    client: httpx.AsyncClient, store: Store, fistful: FakeProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Machinegun retries storage by its ``retries.storage`` policy; its clients do not retry."""
    from mainspring.machines import data, service

    failing = {"reads": 2, "writes": 2}
    real_read, real_create = data.namespace_and_taken, service._create

    async def read(*args: Any) -> Any:
        if failing["reads"]:
            failing["reads"] -= 1
            raise ConnectionRefusedError(111, "the database is restarting")
        return await real_read(*args)

    async def create(*args: Any) -> Any:
        if failing["writes"]:
            failing["writes"] -= 1
            raise ConnectionResetError(104, "connection reset")
        return await real_create(*args)

    monkeypatch.setattr(data, "namespace_and_taken", read)
    monkeypatch.setattr(service, "_create", create)
    mg = AutomatonClient(client)
    assert await mg.Start(FISTFUL_NS, "m", s("go")) is None
    assert failing == {"reads": 0, "writes": 0} and len(fistful.calls) == 1  # the processor was called once
    assert [e.id for e in (await mg.GetMachine(desc(FISTFUL_NS, "m"))).history] == [1]

    # The commit went through but its answer was lost with the connection: the retry finds its own machine
    # and answers success, not MachineAlreadyExists.
    real_grouped = store.grouped

    async def lost_answer(work: Any) -> Any:
        await real_grouped(work)
        monkeypatch.setattr(store, "grouped", real_grouped)
        raise ConnectionResetError(104, "connection reset after the commit")

    monkeypatch.setattr(store, "grouped", lost_answer)
    assert await mg.Start(FISTFUL_NS, "m2", s("go")) is None
    assert [e.id for e in (await mg.GetMachine(desc(FISTFUL_NS, "m2"))).history] == [1]
    with pytest.raises(stateproc.MachineAlreadyExists):  # a real second Start still is one
        await mg.Start(FISTFUL_NS, "m2", s("go"))

    # A store that stays down past the caller's deadline: 503, nothing done.
    failing["reads"] = 10_000
    short = AutomatonClient(client, now_ms=store.clock.now_ms, deadline_ms=300)
    with pytest.raises(woody.WoodyError) as down:
        await short.Start(FISTFUL_NS, "m3", NIL)
    assert (down.value.status, down.value.error_class) == (503, "Resource Unavailable")


class TestOwnListener:
    """Machinegun as deployed: its own port, /v1/automaton and /v1/event_sink, no token (auth = none)."""

    @pytest.fixture
    def port(self) -> int:
        return free_port()

    @pytest.fixture
    def settings(self, database_url: str, tmp_path: Path, port: int) -> Settings:
        return _with_tokens(database_url, tmp_path, auth="none", listen=f"127.0.0.1:{port}", event_sinks={"payments": [FISTFUL_NS]})

    async def test_the_listener_serves_the_automaton_and_the_polling_event_sink(
        self, client: httpx.AsyncClient, fistful: FakeProcessor, registry: App, port: int
    ) -> None:
        registry.processors["other"] = Registration(FakeProcessor())
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            mg = AutomatonClient(http, url="/v1/automaton", headers=woody_erlang_headers())
            for _attempt in range(100):  # the listener starts with the server's loops
                try:
                    await mg.Start(FISTFUL_NS, "w/1", s("one"))
                    break
                except httpx.ConnectError:
                    await asyncio.sleep(0.05)
            await mg.Start("other", "o", NIL)
            await mg.Call(desc(FISTFUL_NS, "w/1"), s("two"))
            assert [e.id for e in (await mg.GetMachine(desc(FISTFUL_NS, "w/1"))).history] == [1, 2]

            sink = AutomatonClient(http, url="/v1/event_sink", service=stateproc.EventSink)

            async def both() -> Any:
                got = await sink.GetHistory("payments", stateproc.HistoryRange(limit=10))
                return got if len(got) == 2 else None

            history = await eventually(both, what="both events of the sink's namespace on the sink")
            assert [(e.source_ns, e.source_id, e.event.id, e.event.data) for e in history] == [
                (FISTFUL_NS, "w/1", 1, V(obj={s("started"): s("one")})), (FISTFUL_NS, "w/1", 2, V(obj={s("called"): s("two")}))]
            assert history[0].id < history[1].id
            after_first = await sink.GetHistory("payments", stateproc.HistoryRange(after=history[0].id, limit=10))
            assert [e.event.id for e in after_first] == [2]
            assert await sink.GetHistory("payments", stateproc.HistoryRange(after=history[1].id)) == []
            with pytest.raises(stateproc.EventSinkNotFound):
                await sink.GetHistory("nope", stateproc.HistoryRange())
            assert (await http.get("/v1/namespaces")).status_code == 404  # only Machinegun's two paths here
        # The main server's JSON API keeps its tokens.
        assert (await client.get(f"/v1/namespaces/{quote(FISTFUL_NS, safe='')}/machines/m")).status_code == 401

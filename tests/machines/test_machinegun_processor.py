"""A processor written for Machinegun (Thrift ``Processor`` over woody) behind a namespace with
``processor.protocol = "machinegun"``: init → call → timer → notification → failure → repair, with the
ranges, timer timeouts, format versions and aux state Machinegun's processors use."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from mainspring.machines.machinegun import woody
from mainspring.machines.machinegun.codec import value_to_json
from mainspring.machines.machinegun.idl import stateproc
from mainspring.store import ManualClock
from tests.machines.conftest import eventually, serve_app
from tests.machines.machinegun import NIL, AutomatonClient, Unavailable, V, desc, s, woody_processor_app

NS = "mg"
Content = stateproc.Content


def _action(**timer: Any) -> Any:
    if not timer:
        return stateproc.ComplexAction()
    return stateproc.ComplexAction(timer=stateproc.TimerAction(**timer))


class Invoices:
    """Machinegun-style business logic: events with format versions, aux state, a reminder timer that
    reads only the newest event, failures and repairs on request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []
        self.requests: list[dict[str, str]] = []
        self.unavailable = 0

    def ProcessSignal(self, a: Any) -> Any:
        machine = a.machine
        if a.signal.init is not None:
            self.seen.append(("init", machine))
            timer = stateproc.SetTimerAction(
                timer=stateproc.base.Timer(timeout=1),
                range=stateproc.HistoryRange(limit=1, direction=stateproc.Direction.backward),
                timeout=7,
            )
            change = stateproc.MachineStateChange(
                aux_state=Content(format_version=2, data=V(obj={s("due"): V(i=100)})),
                events=[Content(format_version=1, data=V(obj={s("issued"): a.signal.init.arg}))],
            )
            return stateproc.SignalResult(change=change, action=_action(set_timer=timer))
        if a.signal.timeout is not None:
            self.seen.append(("timeout", machine))
            return stateproc.SignalResult(change=stateproc.MachineStateChange(events=[Content(data=s("overdue"))]), action=_action())
        self.seen.append(("notification", machine))
        if self.unavailable:
            self.unavailable -= 1
            raise Unavailable("deploying")
        event = Content(data=V(obj={s("note"): a.signal.notification.arg}))
        return stateproc.SignalResult(change=stateproc.MachineStateChange(events=[event]), action=_action())

    def ProcessCall(self, a: Any) -> Any:
        self.seen.append(("call", a.machine))
        if a.arg == s("crash"):
            raise RuntimeError("a bug in the processor")
        if a.arg == s("busy") or (a.arg == s("flaky") and self.unavailable):
            self.unavailable -= 1
            raise Unavailable("try later")
        change = stateproc.MachineStateChange(events=[Content(format_version=1, data=V(obj={s("paid"): a.arg}))])
        response = V(obj={s("paid"): a.arg, s("history"): V(i=len(a.machine.history))})
        return stateproc.CallResult(response=response, change=change, action=_action(unset_timer=stateproc.UnsetTimerAction()))

    def ProcessRepair(self, a: Any) -> Any:
        self.seen.append(("repair", a.machine))
        if a.arg == s("refuse"):
            raise stateproc.RepairFailed(reason=V(obj={s("why"): V(bin=b"\x00no")}))
        change = stateproc.MachineStateChange(events=[Content(data=s("repaired"))], aux_state=Content(data=NIL))
        return stateproc.RepairResult(response=s("fixed"), change=change, action=_action())


@pytest.fixture
async def invoices(client: httpx.AsyncClient) -> AsyncIterator[Invoices]:
    handler = Invoices()
    async with serve_app(woody_processor_app(handler)) as url:
        namespace = {"processor": {"url": url, "timeout_ms": 5000, "protocol": "machinegun"}, "retry": {"initial_ms": 1000, "max_attempts": 3}}
        put = await client.put(f"/v1/namespaces/{NS}", json=namespace)
        assert put.status_code == 200 and put.json()["processor"]["protocol"] == "machinegun"
        yield handler


async def test_init_call_timer_notification_failure_repair(client: httpx.AsyncClient, invoices: Invoices, clock: ManualClock) -> None:
    mg = AutomatonClient(client, now_ms=clock.now_ms)

    # init: the processor's events keep their format version, its aux state too, and its timer is set.
    await mg.Start(NS, "inv-1", V(i=100))
    kind, machine = invoices.seen[-1]
    assert kind == "init" and machine.ns == NS and machine.history == [] and machine.status.working is not None
    assert woody.TRACE_ID in invoices.requests[-1] and woody.DEADLINE in invoices.requests[-1]
    got = await mg.GetMachine(desc(NS, "inv-1"))
    assert got.history[0].format_version == 1 and got.history[0].data == V(obj={s("issued"): V(i=100)})
    assert got.aux_state == Content(format_version=2, data=V(obj={s("due"): V(i=100)})) and got.timer is not None
    json_view = (await client.get(f"/v1/namespaces/{NS}/machines/inv-1")).json()
    assert json_view["history"][0]["data"] == {"$fv": 1, "$data": {"issued": 100}}  # the documented stored form
    assert json_view["aux_state"] == {"$fv": 2, "$data": {"due": 100}}

    # The timer fires after its 1 s with its own range (the newest event only) and the machine's timer shown.
    clock.advance(1000)
    await eventually(lambda: _seen(invoices, "timeout"), what="the timeout signal")
    _, fired = invoices.seen[-1]
    assert [e.id for e in fired.history] == [1] and fired.history_range.limit == 1
    assert fired.history_range.direction == stateproc.Direction.backward
    await eventually(lambda: _events(mg, 2), what="the timeout's event")

    # call: the caller's range reaches the processor; the answer comes back as a Value; the timer is unset.
    response = await mg.Call(desc(NS, "inv-1", after=1), s("60"))
    assert response == V(obj={s("paid"): s("60"), s("history"): V(i=1)})
    assert invoices.seen[-1][1].history_range.after == 1
    assert (await mg.GetMachine(desc(NS, "inv-1"))).timer is None

    # notification: delivered later with the range Notify was given; a 503 from the processor is retried.
    invoices.unavailable = 1
    await mg.Notify(desc(NS, "inv-1", limit=2), s("emailed"))
    await eventually(lambda: _seen(invoices, "notification"), what="the first delivery")
    await eventually(lambda: _pending_retry(client), what="the failed delivery's retry")
    clock.advance(1000)  # the retry policy's first delay
    await eventually(lambda: _events(mg, 4), what="the notification's event after one retry")
    deliveries = [m for k, m in invoices.seen if k == "notification"]
    assert len(deliveries) == 2 and all(len(m.history) == 2 and m.history_range.limit == 2 for m in deliveries)

    # A processor unavailable for a call: 503 Resource Unavailable, and the machine is unchanged.
    with pytest.raises(woody.WoodyError) as busy:
        await mg.Call(desc(NS, "inv-1"), s("busy"))
    assert (busy.value.status, busy.value.error_class) == (503, "Resource Unavailable")
    assert (await mg.GetMachine(desc(NS, "inv-1"))).status.working is not None

    # failure: a processor crashing (500 Result Unexpected) fails the machine, as Machinegun does.
    with pytest.raises(stateproc.MachineFailed):
        await mg.Call(desc(NS, "inv-1"), s("crash"))
    failed = await mg.GetMachine(desc(NS, "inv-1"))
    assert failed.status.failed is not None and "Result Unexpected" in failed.status.failed.reason

    # repair: a refusal is RepairFailed with the processor's reason; then a repair that works.
    with pytest.raises(stateproc.RepairFailed) as refused:
        await mg.Repair(desc(NS, "inv-1"), s("refuse"))
    assert refused.value.reason == V(obj={s("why"): V(bin=b"\x00no")})
    assert (await mg.GetMachine(desc(NS, "inv-1"))).status.failed is not None
    assert await mg.Repair(desc(NS, "inv-1"), s("ok")) == s("fixed")
    repaired = await mg.GetMachine(desc(NS, "inv-1"))
    assert repaired.status.working is not None and repaired.aux_state.data == NIL
    assert [value_to_json(e.data) for e in repaired.history] == [
        {"issued": 100}, "overdue", {"paid": "60"}, {"note": "emailed"}, "repaired",
    ]


async def _seen(handler: Invoices, kind: str) -> bool:
    return any(k == kind for k, _ in handler.seen)


async def _pending_retry(client: httpx.AsyncClient) -> bool:
    failures = (await client.get(f"/v1/namespaces/{NS}/machines/inv-1")).json()["failures"]
    return any(f["kind"] == "notification" and f["outcome"] == "retry" for f in failures)


async def _events(mg: AutomatonClient, count: int) -> bool:
    return len((await mg.GetMachine(desc(NS, "inv-1"))).history) >= count


async def test_retry_policies_per_kind(client: httpx.AsyncClient, invoices: Invoices) -> None:
    """``retries.processor`` retries a transient processor failure within one call (Machinegun's processor
    policy); without it the call is answered 503 at once, as before."""
    mg = AutomatonClient(client)
    await mg.Start(NS, "inv-2", V(i=1))
    invoices.unavailable = 1
    with pytest.raises(woody.WoodyError):
        await mg.Call(desc(NS, "inv-2"), s("flaky"))
    namespace = (await client.get(f"/v1/namespaces/{NS}")).json()
    assert namespace["retries"] == {"timers": None, "notifications": None, "processor": None, "storage": None}
    namespace["retries"] = {"processor": {"initial_ms": 10, "max_attempts": 5}, "timers": {"initial_ms": 5000}}
    put = await client.put(f"/v1/namespaces/{NS}", json={k: namespace[k] for k in ("processor", "retry", "history", "retries")})
    assert put.status_code == 200 and put.json()["retries"]["timers"]["initial_ms"] == 5000
    invoices.unavailable = 2
    calls = len(invoices.seen)
    response = await mg.Call(desc(NS, "inv-2"), s("flaky"))
    assert value_to_json(response)["paid"] == "flaky"
    assert len(invoices.seen) - calls == 3  # two 503s retried, then the answer

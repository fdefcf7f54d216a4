"""HTTP operations of the machines face (API.md §2)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import StringConstraints

from mainspring.core.errors import InvalidRequest
from mainspring.machines import namespaces as ns_service
from mainspring.machines import service
from mainspring.machines.models import (
    CallIn,
    CallOut,
    HistoryQuery,
    Machine,
    MachineList,
    MachineName,
    MachinesQuery,
    NamespaceIn,
    NamespaceOut,
    NotifyIn,
    NotifyOut,
    Operation,
    RepairIn,
    StartIn,
)
from mainspring.machines.settings import HistoryRange, NamespaceConfig
from mainspring.web.http import PROBLEM
from mainspring.web.routing import Call, Reply, Routes

OperationKey = Annotated[str, StringConstraints(min_length=1, max_length=200)]
routes = Routes("/v1", tag="machines", params={"ns": MachineName, "id": MachineName, "key": OperationKey})

SCOPE = "machines:{ns}"
NOT_FOUND = {404: "namespace_not_found / machine_not_found"}
STEP_PROBLEMS = {
    **NOT_FOUND,
    409: "machine_already_exists / machine_failed / machine_already_working",
    502: "processor_failed / processor_refused",
    504: "processor_timeout",
}
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,200}")


def _idempotency_key(call: Call[Any]) -> str | None:
    key = call.header("Idempotency-Key")
    if key is not None and not IDEMPOTENCY_KEY.fullmatch(key):
        raise InvalidRequest("header Idempotency-Key is not valid",
                             errors=[{"loc": ["header", "Idempotency-Key"], "msg": "1 to 200 printable ASCII characters"}])
    return key


def _reply(reply: service.Reply) -> Reply:
    if reply.status >= 400:
        return Reply(reply.body, status=reply.status, media_type=PROBLEM)
    return Reply(reply.body, status=reply.status)


@routes.put("/namespaces/{ns}", scope=SCOPE, body=NamespaceIn, answer=NamespaceOut)
async def put_namespace(call: Call[NamespaceIn]) -> Any:
    """Create or change a namespace; every server uses the new settings from its next step, no restart."""
    saved = await ns_service.put_namespace(call.ctx, call.params["ns"], NamespaceConfig.model_validate(call.body.model_dump()))
    return saved.to_api(call.ctx)


@routes.get("/namespaces/{ns}", scope=SCOPE, answer=NamespaceOut, problems={404: "namespace_not_found"})
async def get_namespace(call: Call[None]) -> Any:
    """A namespace's processor and retry settings."""
    return (await ns_service.get_namespace(call.ctx, call.params["ns"])).to_api(call.ctx)


@routes.post("/namespaces/{ns}/machines", scope=SCOPE, body=StartIn, answer=Machine, status=201, problems=STEP_PROBLEMS)
async def start(call: Call[StartIn]) -> Any:
    """Start a machine: the processor's ``init`` answer becomes its first events, aux state and timer."""
    return _reply(await service.start_machine(call.ctx, call.params["ns"], call.body.id, call.body.args, _idempotency_key(call)))


@routes.get("/namespaces/{ns}/machines", scope=SCOPE, query=MachinesQuery, answer=MachineList, problems=NOT_FOUND)
async def list_machines(call: Call[None]) -> Any:
    """A namespace's machines, by status."""
    query: MachinesQuery = call.query
    items, next_cursor = await service.list_machines(call.ctx, call.params["ns"], query.status, query.limit, query.cursor)
    return {"machines": items, "next_cursor": next_cursor}


@routes.get("/namespaces/{ns}/machines/{id}", scope=SCOPE, query=HistoryQuery, answer=Machine, problems=NOT_FOUND)
async def get_machine(call: Call[None]) -> Any:
    """The machine with the requested part of its history and its failure journal."""
    query: HistoryQuery = call.query
    return await service.get_machine(call.ctx, call.params["ns"], call.params["id"],
                                     HistoryRange(after=query.after, limit=query.limit, direction=query.direction))


@routes.post("/namespaces/{ns}/machines/{id}/call", scope=SCOPE, body=CallIn, answer=CallOut, problems=STEP_PROBLEMS)
async def call_machine(call: Call[CallIn]) -> Any:
    """Call the machine: the processor's answer to ``call`` is saved, its ``response`` answered."""
    return _reply(await service.call_machine(call.ctx, call.params["ns"], call.params["id"], call.body.args,
                                             _idempotency_key(call), call.body.timeout_ms))


@routes.post("/namespaces/{ns}/machines/{id}/notifications", scope=SCOPE, body=NotifyIn, answer=NotifyOut, status=202,
             problems=NOT_FOUND)
async def notify(call: Call[NotifyIn]) -> Any:
    """Queue a notification for the machine; it is delivered later, in order, at least once."""
    return _reply(await service.notify_machine(call.ctx, call.params["ns"], call.params["id"], call.body.args,
                                               _idempotency_key(call)))


@routes.post("/namespaces/{ns}/machines/{id}/repair", scope=SCOPE, body=RepairIn, answer=CallOut, problems=STEP_PROBLEMS)
async def repair(call: Call[RepairIn]) -> Any:
    """Repair a failed machine through the processor's ``repair`` (or at once with ``simple``)."""
    return _reply(await service.repair_machine(call.ctx, call.params["ns"], call.params["id"], call.body.args,
                                               _idempotency_key(call), call.body.simple))


@routes.delete("/namespaces/{ns}/machines/{id}", scope=SCOPE, status=204, problems=NOT_FOUND)
async def remove(call: Call[None]) -> Any:
    """Remove a machine and its history."""
    await service.remove_machine(call.ctx, call.params["ns"], call.params["id"])


@routes.get("/namespaces/{ns}/machines/{id}/operations/{key}", scope=SCOPE, answer=Operation,
            problems={404: "operation_not_found"})
async def operation(call: Call[None]) -> Any:
    """Whether and how the operation sent with this Idempotency-Key ended."""
    return await service.get_operation(call.ctx, call.params["ns"], call.params["id"], call.params["key"])

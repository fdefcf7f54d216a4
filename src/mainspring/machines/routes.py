"""HTTP operations of the machines face (API.md §2)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import StringConstraints

from mainspring.core.errors import InvalidRequest
from mainspring.machines import namespaces as ns_service
from mainspring.machines import service
from mainspring.machines.errors import (
    IdempotencyKeyReused,
    MachineAlreadyExists,
    MachineAlreadyWorking,
    MachineBusy,
    MachineFailed,
    MachineNotFound,
    NamespaceNotFound,
    OperationNotFound,
    ProcessorFailed,
    ProcessorRefused,
    ProcessorTimeout,
)
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
from mainspring.web.permissions import Scope
from mainspring.web.routing import Call, Reply, Routes

OperationKey = Annotated[str, StringConstraints(min_length=1, max_length=200)]
routes = Routes("/v1", tag="machines")

SCOPE = Scope("machines:{ns}")
NOT_FOUND = [NamespaceNotFound, MachineNotFound]
STEP_PROBLEMS = [*NOT_FOUND, MachineAlreadyExists, MachineFailed, MachineAlreadyWorking, MachineBusy, IdempotencyKeyReused,
                 ProcessorFailed, ProcessorRefused, ProcessorTimeout]
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,200}")


def _idempotency_key(call: Call) -> str | None:
    key = call.header("Idempotency-Key")
    if key is not None and not IDEMPOTENCY_KEY.fullmatch(key):
        raise InvalidRequest("header Idempotency-Key is not valid",
                             errors=[{"loc": ["header", "Idempotency-Key"], "msg": "1 to 200 printable ASCII characters"}])
    return key


def _reply(reply: service.Reply) -> Reply:
    if reply.status >= 400:
        return Reply(reply.body, status=reply.status, media_type=PROBLEM)
    return Reply(reply.body, status=reply.status)


@routes.put("/namespaces/{ns}", permission=SCOPE)
async def put_namespace(call: Call, ns: MachineName, body: NamespaceIn) -> NamespaceOut:
    """Create or change a namespace; every server uses the new settings from its next step, no restart."""
    saved = await ns_service.put_namespace(call.ctx, ns, NamespaceConfig.model_validate(body.model_dump()))
    return NamespaceOut.model_validate(saved.to_api(call.ctx))


@routes.get("/namespaces/{ns}", permission=SCOPE, problems=[NamespaceNotFound])
async def get_namespace(call: Call, ns: MachineName) -> NamespaceOut:
    """A namespace's processor and retry settings."""
    return NamespaceOut.model_validate((await ns_service.get_namespace(call.ctx, ns)).to_api(call.ctx))


@routes.post("/namespaces/{ns}/machines", permission=SCOPE, status=201, problems=STEP_PROBLEMS)
async def start(call: Call, ns: MachineName, body: StartIn) -> Machine | Reply:
    """Start a machine: the processor's ``init`` answer becomes its first events, aux state and timer."""
    return _reply(await service.start_machine(call.ctx, ns, body.id, body.args, _idempotency_key(call)))


@routes.get("/namespaces/{ns}/machines", permission=SCOPE, problems=NOT_FOUND)
async def list_machines(call: Call, ns: MachineName, query: MachinesQuery) -> MachineList:
    """A namespace's machines, by status."""
    items, next_cursor = await service.list_machines(call.ctx, ns, query.status, query.limit, query.cursor)
    return MachineList.model_validate({"machines": items, "next_cursor": next_cursor})


@routes.get("/namespaces/{ns}/machines/{id}", permission=SCOPE, problems=NOT_FOUND)
async def get_machine(call: Call, ns: MachineName, id: MachineName, query: HistoryQuery) -> Machine:
    """The machine with the requested part of its history and its failure journal."""
    return Machine.model_validate(
        await service.get_machine(call.ctx, ns, id, HistoryRange(after=query.after, limit=query.limit, direction=query.direction)))


@routes.post("/namespaces/{ns}/machines/{id}/call", permission=SCOPE, problems=STEP_PROBLEMS)
async def call_machine(call: Call, ns: MachineName, id: MachineName, body: CallIn) -> CallOut | Reply:
    """Call the machine: the processor's answer to ``call`` is saved, its ``response`` answered."""
    return _reply(await service.call_machine(call.ctx, ns, id, body.args, _idempotency_key(call), body.timeout_ms))


@routes.post("/namespaces/{ns}/machines/{id}/notifications", permission=SCOPE, status=202, problems=NOT_FOUND)
async def notify(call: Call, ns: MachineName, id: MachineName, body: NotifyIn) -> NotifyOut | Reply:
    """Queue a notification for the machine; it is delivered later, in order, at least once."""
    return _reply(await service.notify_machine(call.ctx, ns, id, body.args, _idempotency_key(call)))


@routes.post("/namespaces/{ns}/machines/{id}/repair", permission=SCOPE, problems=STEP_PROBLEMS)
async def repair(call: Call, ns: MachineName, id: MachineName, body: RepairIn) -> CallOut | Reply:
    """Repair a failed machine through the processor's ``repair`` (or at once with ``simple``)."""
    return _reply(await service.repair_machine(call.ctx, ns, id, body.args, _idempotency_key(call), body.simple))


@routes.delete("/namespaces/{ns}/machines/{id}", permission=SCOPE, status=204, problems=NOT_FOUND)
async def remove(call: Call, ns: MachineName, id: MachineName) -> None:
    """Remove a machine and its history."""
    await service.remove_machine(call.ctx, ns, id)


@routes.get("/namespaces/{ns}/machines/{id}/operations/{key}", permission=SCOPE, problems=[OperationNotFound])
async def operation(call: Call, ns: MachineName, id: MachineName, key: OperationKey) -> Operation:
    """Whether and how the operation sent with this Idempotency-Key ended."""
    return Operation.model_validate(await service.get_operation(call.ctx, ns, id, key))

"""HTTP routes of the exchange face (API.md §1): parse → call the service → answer."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse

from mainspring.core.auth import Principal, authenticate, requires
from mainspring.core.errors import InvalidRequest
from mainspring.core.runtime import Context, context_of
from mainspring.core.types import NAME_PATTERN, Limit
from mainspring.exchange import messages, service
from mainspring.exchange.models import (
    STATES,
    CommitFailedRequest,
    Message,
    MessageList,
    Process,
    ProcessList,
    ReadyRequest,
    ReadyResponse,
    ResolveRequest,
    StartRequest,
)

router = APIRouter(prefix="/v1/exchange", tags=["exchange"])

PathName = Annotated[str, Path(pattern=NAME_PATTERN, max_length=128)]
Ctx = Annotated[Context, Depends(context_of)]
Caller = Annotated[Principal, Depends(authenticate)]
MAILBOX = "/mailboxes/{addressee}/{database}"
_HEADER_LIMIT = 400


def receiver(principal: Principal) -> service.Check:
    return lambda addressee: principal.require(f"exchange:receive:{addressee}")


def _header(name: str, value: str | None, *, pattern: bool = False) -> str | None:
    if value is None:
        return None
    bad = len(value) > _HEADER_LIMIT or "\x00" in value or (pattern and not re.fullmatch(NAME_PATTERN, value))
    if bad:
        raise InvalidRequest(f"header {name} is not valid", errors=[{"loc": ["header", name], "msg": "invalid value"}])
    return value


@router.post(
    MAILBOX + "/messages",
    response_model=Message,
    status_code=201,
    dependencies=[Depends(requires("exchange:send:{addressee}"))],
    responses={200: {"model": Message, "description": "already stored with this Message-Id"}},
    openapi_extra={"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
)
async def store_message(
    request: Request,
    ctx: Ctx,
    addressee: PathName,
    database: PathName,
    content_type: Annotated[str | None, Header()] = None,
    message_id: Annotated[str | None, Header(alias="Message-Id")] = None,
    x_sender: Annotated[str | None, Header()] = None,
) -> Any:
    """Store a message (raw body). A repeated ``Message-Id`` with the same bytes answers 200 and the same
    message; with other bytes ``409 message_id_conflict``."""
    data = await request.body()
    message, created = await messages.store_message(
        ctx, addressee, database, data,
        content_type=_header("Content-Type", content_type),
        message_key=_header("Message-Id", message_id, pattern=True),
        sender=_header("X-Sender", x_sender),
    )
    return JSONResponse(message, status_code=201 if created else 200)


@router.get(MAILBOX + "/messages", response_model=MessageList,
            dependencies=[Depends(requires("exchange:receive:{addressee}"))])
async def list_messages(
    ctx: Ctx, addressee: PathName, database: PathName, limit: Limit = 100, cursor: str | None = None
) -> Any:
    """API_1: the messages available for processing, oldest first, and whether a process holds the mailbox."""
    return await messages.list_available(ctx, addressee, database, limit=limit, cursor=cursor)


@router.get(MAILBOX + "/messages/{message_id}", response_class=Response,
            dependencies=[Depends(requires("exchange:receive:{addressee}"))],
            responses={200: {"content": {"application/octet-stream": {}}}})
async def read_message(ctx: Ctx, addressee: PathName, database: PathName, message_id: PathName) -> Response:
    """One message's bytes with its content type; ``404 message_not_found`` once committed."""
    message, data = await messages.read_message(ctx, addressee, database, message_id)
    return Response(content=data, media_type=message["content_type"],
                    headers={"X-Message-Sha256": message["sha256"], "X-Message-Id": message["id"]})


@router.post(MAILBOX + "/processes", response_model=Process, status_code=201,
             dependencies=[Depends(requires("exchange:receive:{addressee}"))])
async def start_process(ctx: Ctx, addressee: PathName, database: PathName, body: StartRequest) -> Any:
    """API_2: start processing all of ``message_ids`` (all or nothing); ``409 busy`` while another
    process holds the mailbox."""
    return await service.start_process(ctx, addressee, database, body.client_id, body.message_ids)


@router.post("/processes/{process_id}/heartbeat", response_model=Process)
async def heartbeat(ctx: Ctx, principal: Caller, process_id: PathName) -> Any:
    """Keep a process alive: a new ``deadline``; ``409 cancelled`` once it is not."""
    return await service.heartbeat(ctx, process_id, receiver(principal))


@router.post("/processes/{process_id}/ready", response_model=ReadyResponse)
async def ready(
    ctx: Ctx, principal: Caller, process_id: PathName, body: Annotated[ReadyRequest | None, Body()] = None
) -> Any:
    """API_3: processed; may commit. Replies are stored but not visible until API_4."""
    replies = body.replies if body else []
    for reply in replies:
        principal.require(f"exchange:send:{reply.addressee}")
    process = await service.ready(ctx, process_id, replies, receiver(principal))
    return {"status": "OK", "process": process}


@router.post("/processes/{process_id}/committed", response_model=Process)
async def committed(ctx: Ctx, principal: Caller, process_id: PathName) -> Any:
    """API_4: the client's database committed. The messages go, the replies appear."""
    return await service.committed(ctx, process_id, receiver(principal))


@router.post("/processes/{process_id}/commit-failed", response_model=Process)
async def commit_failed(
    ctx: Ctx, principal: Caller, process_id: PathName,
    body: Annotated[CommitFailedRequest | None, Body()] = None,
) -> Any:
    """API_5: the client's database did not commit. The messages are available again."""
    return await service.commit_failed(ctx, process_id, body.error if body else None, receiver(principal))


@router.post("/processes/{process_id}/resolve", response_model=Process,
             dependencies=[Depends(requires("admin"))])
async def resolve(ctx: Ctx, process_id: PathName, body: ResolveRequest) -> Any:
    """Administrator: resolve an IN_DOUBT process as API_4 (``committed``) or API_5 would."""
    return await service.resolve(ctx, process_id, body.committed)


@router.get("/processes/{process_id}", response_model=Process)
async def get_process(ctx: Ctx, principal: Caller, process_id: PathName) -> Any:
    return await service.get_process(ctx, process_id, receiver(principal))


@router.get("/processes", response_model=ProcessList)
async def list_processes(
    ctx: Ctx,
    principal: Caller,
    state: Annotated[str | None, Query(pattern="^(" + "|".join(STATES) + ")$")] = None,
    addressee: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    database: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    limit: Limit = 100,
    cursor: str | None = None,
) -> Any:
    """Processes, oldest first; filter by state and mailbox. Without ``addressee`` it needs ``admin``."""
    principal.require(f"exchange:receive:{addressee}" if addressee else "admin")
    return await service.list_processes(
        ctx, state=state, addressee=addressee, database=database, limit=limit, cursor=cursor
    )


@router.get("/mailboxes", tags=["exchange"])
async def list_mailboxes(ctx: Ctx, principal: Caller) -> Any:
    """Mailboxes the caller may receive from, with their available message counts and active process."""
    boxes = await messages.list_mailboxes(ctx)
    return {"mailboxes": [b for b in boxes if principal.allows(f"exchange:receive:{b['addressee']}")]}

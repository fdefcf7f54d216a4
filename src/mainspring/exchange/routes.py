"""HTTP operations of the exchange face (API.md §1): parse → call the service → answer."""

from __future__ import annotations

import re
from typing import Any

from mainspring.core.auth import Principal
from mainspring.core.errors import InvalidRequest
from mainspring.core.types import NAME_PATTERN, Name, Page
from mainspring.exchange import messages, service
from mainspring.exchange.models import (
    CommitFailedRequest,
    MailboxList,
    Message,
    MessageList,
    Process,
    ProcessesQuery,
    ProcessList,
    ReadyRequest,
    ReadyResponse,
    ResolveRequest,
    StartRequest,
)
from mainspring.web.routing import Call, RawBody, Reply, Routes

routes = Routes("/v1/exchange", tag="exchange",
                params={"addressee": Name, "database": Name, "message_id": Name, "process_id": Name})

MAILBOX = "/mailboxes/{addressee}/{database}"
SEND = "exchange:send:{addressee}"
RECEIVE = "exchange:receive:{addressee}"
PROCESS_PROBLEMS = {404: "process_not_found", 409: "cancelled / not_in_doubt"}
_HEADER_LIMIT = 400


def receiver(principal: Principal) -> service.Check:
    return lambda addressee: principal.require(f"exchange:receive:{addressee}")


def _header(call: Call[Any], name: str, *, pattern: bool = False) -> str | None:
    value = call.header(name)
    if value is None:
        return None
    bad = len(value) > _HEADER_LIMIT or "\x00" in value or (pattern and not re.fullmatch(NAME_PATTERN, value))
    if bad:
        raise InvalidRequest(f"header {name} is not valid", errors=[{"loc": ["header", name], "msg": "invalid value"}])
    return value


@routes.post(MAILBOX + "/messages", scope=SEND, body=RawBody, answer=Message, status=201,
             answers={200: "already stored with this Message-Id"},
             problems={409: "message_id_conflict", 413: "too_large"},
             body_limit=lambda settings: settings.exchange.max_message_bytes)
async def store_message(call: Call[bytes]) -> Any:
    """Store a message (raw body; headers ``Content-Type``, ``Message-Id`` as the idempotency key, ``X-Sender``).
    A repeated ``Message-Id`` with the same bytes answers 200 and the same message; with other bytes
    ``409 message_id_conflict``."""
    message, created = await messages.store_message(
        call.ctx, call.params["addressee"], call.params["database"], call.body,
        content_type=_header(call, "Content-Type"),
        message_key=_header(call, "Message-Id", pattern=True),
        sender=_header(call, "X-Sender"),
    )
    return message if created else Reply(message, status=200)


@routes.get(MAILBOX + "/messages", scope=RECEIVE, query=Page, answer=MessageList)
async def list_messages(call: Call[None]) -> Any:
    """API_1: the messages available for processing, oldest first, and whether a process holds the mailbox."""
    return await messages.list_available(call.ctx, call.params["addressee"], call.params["database"],
                                         limit=call.query.limit, cursor=call.query.cursor)


@routes.get(MAILBOX + "/messages/{message_id}", scope=RECEIVE, problems={404: "message_not_found"},
            content={"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}})
async def read_message(call: Call[None]) -> Any:
    """One message's bytes with its content type; ``404 message_not_found`` once committed."""
    message, data = await messages.read_message(call.ctx, call.params["addressee"], call.params["database"],
                                                call.params["message_id"])
    return Reply(data, media_type=message["content_type"],
                 headers={"X-Message-Sha256": message["sha256"], "X-Message-Id": message["id"]})


@routes.post(MAILBOX + "/processes", scope=RECEIVE, body=StartRequest, answer=Process, status=201,
             problems={404: "not_found", 409: "busy / messages_unavailable"})
async def start_process(call: Call[StartRequest]) -> Any:
    """API_2: start processing all of ``message_ids`` (all or nothing); ``409 busy`` while another
    process holds the mailbox."""
    return await service.start_process(call.ctx, call.params["addressee"], call.params["database"], call.body.client_id,
                                       call.body.message_ids)


@routes.post("/processes/{process_id}/heartbeat", answer=Process, problems=PROCESS_PROBLEMS)
async def heartbeat(call: Call[None]) -> Any:
    """Keep a process alive: a new ``deadline``; ``409 cancelled`` once it is not."""
    return await service.heartbeat(call.ctx, call.params["process_id"], receiver(call.principal))


@routes.post("/processes/{process_id}/ready", body=ReadyRequest, body_required=False, answer=ReadyResponse,
             problems=PROCESS_PROBLEMS)
async def ready(call: Call[ReadyRequest | None]) -> Any:
    """API_3: processed; may commit. Replies are stored but not visible until API_4."""
    replies = call.body.replies if call.body else []
    for reply in replies:
        call.principal.require(f"exchange:send:{reply.addressee}")
    process = await service.ready(call.ctx, call.params["process_id"], replies, receiver(call.principal))
    return {"status": "OK", "process": process}


@routes.post("/processes/{process_id}/committed", answer=Process, problems=PROCESS_PROBLEMS)
async def committed(call: Call[None]) -> Any:
    """API_4: the client's database committed. The messages go, the replies appear."""
    return await service.committed(call.ctx, call.params["process_id"], receiver(call.principal))


@routes.post("/processes/{process_id}/commit-failed", body=CommitFailedRequest, body_required=False, answer=Process,
             problems=PROCESS_PROBLEMS)
async def commit_failed(call: Call[CommitFailedRequest | None]) -> Any:
    """API_5: the client's database did not commit. The messages are available again."""
    return await service.commit_failed(call.ctx, call.params["process_id"], call.body.error if call.body else None,
                                       receiver(call.principal))


@routes.post("/processes/{process_id}/resolve", scope="admin", body=ResolveRequest, answer=Process, problems=PROCESS_PROBLEMS)
async def resolve(call: Call[ResolveRequest]) -> Any:
    """Administrator: resolve an IN_DOUBT process as API_4 (``committed``) or API_5 would."""
    return await service.resolve(call.ctx, call.params["process_id"], call.body.committed)


@routes.get("/processes/{process_id}", answer=Process, problems=PROCESS_PROBLEMS)
async def get_process(call: Call[None]) -> Any:
    """One process."""
    return await service.get_process(call.ctx, call.params["process_id"], receiver(call.principal))


@routes.get("/processes", query=ProcessesQuery, answer=ProcessList)
async def list_processes(call: Call[None]) -> Any:
    """Processes, oldest first; filter by state and mailbox. Without ``addressee`` it needs ``admin``."""
    query: ProcessesQuery = call.query
    call.principal.require(f"exchange:receive:{query.addressee}" if query.addressee else "admin")
    return await service.list_processes(call.ctx, state=query.state, addressee=query.addressee, database=query.database,
                                        limit=query.limit, cursor=query.cursor)


@routes.get("/mailboxes", answer=MailboxList)
async def list_mailboxes(call: Call[None]) -> Any:
    """Mailboxes the caller may receive from, with their available message counts and active process."""
    boxes = await messages.list_mailboxes(call.ctx)
    return {"mailboxes": [b for b in boxes if call.principal.allows(f"exchange:receive:{b['addressee']}")]}

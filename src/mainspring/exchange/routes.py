"""HTTP operations of the exchange face (API.md §1): parse → call the service → answer."""

from __future__ import annotations

import re
from collections.abc import Callable

from mainspring.core.auth import Principal
from mainspring.core.errors import InvalidRequest, MainspringError
from mainspring.core.runtime import Context
from mainspring.core.types import NAME_PATTERN, Name
from mainspring.exchange import messages, service
from mainspring.exchange.errors import (
    AlreadyCommitted,
    Busy,
    Cancelled,
    MessageIdConflict,
    MessageNotFound,
    MessagesUnavailable,
    NotInDoubt,
    ProcessNotFound,
    StorageUnavailable,
)
from mainspring.exchange.models import (
    CommitFailedRequest,
    MailboxList,
    Message,
    MessageList,
    MessagesQuery,
    Process,
    ProcessesQuery,
    ProcessList,
    ReadyRequest,
    ReadyResponse,
    ResolveRequest,
    StartRequest,
)
from mainspring.web.permissions import All, Filtered, InBody, Owned, Scope, holds_under
from mainspring.web.routing import AsDeclared, Call, Reply, Routes

routes = Routes("/v1/exchange", tag="exchange")

MAILBOX = "/mailboxes/{addressee}/{database}"
SEND = Scope("exchange:send:{addressee}")
RECEIVE = Scope("exchange:receive:{addressee}")
_HEADER_LIMIT = 400


async def _process(ctx: Context, process_id: str) -> service.ProcessView | None:
    try:
        return await service.get_process(ctx, process_id)
    except ProcessNotFound:
        return None


def _receiver(process: service.ProcessView) -> str:
    return f"exchange:receive:{process['addressee']}"


def _process_of(hidden: type[MainspringError], unknown: Callable[[Principal], bool] | None = None) -> Owned[service.ProcessView]:
    """The process's receiver; a process of another receiver is answered as an unknown one is."""
    return Owned("process_id", _process, _receiver, lambda key: hidden(f"no process {key}"),
                 shown_as="exchange:receive:<the process's addressee>", unknown=unknown)


# Before anything is stored: a token that may not receive the process's messages raises no alert either;
# an unknown id reaches API_4 (and its alert) only from a token that receives from some mailbox.
COMMITTER = _process_of(Cancelled, unknown=lambda principal: holds_under(principal, "exchange:receive:"))
READER = _process_of(ProcessNotFound)
WORKER = _process_of(Cancelled)
REPLIES = InBody(lambda body: [f"exchange:send:{r.addressee}" for r in body.replies] if isinstance(body, ReadyRequest) else [],
                 shown_as="exchange:send:<each reply's addressee>")


def _header(call: Call, name: str, *, pattern: bool = False) -> str | None:
    value = call.header(name)
    if value is None:
        return None
    bad = len(value) > _HEADER_LIMIT or "\x00" in value or (pattern and not re.fullmatch(NAME_PATTERN, value))
    if bad:
        raise InvalidRequest(f"header {name} is not valid", errors=[{"loc": ["header", name], "msg": "invalid value"}])
    return value


@routes.post(MAILBOX + "/messages", permission=SEND, status=201, answers={200: "already stored with this Message-Id"},
             problems=[MessageIdConflict, StorageUnavailable], body_limit=lambda settings: settings.exchange.max_message_bytes)
async def store_message(call: Call, addressee: Name, database: Name, body: bytes) -> Message | AsDeclared | Reply:
    """Store a message (raw body; headers ``Content-Type``, ``Message-Id`` as the idempotency key, ``X-Sender``).
    A repeated ``Message-Id`` with the same bytes answers 200 and the same message; with other bytes
    ``409 message_id_conflict``."""
    message, created = await messages.store_message(
        call.ctx, addressee, database, body,
        content_type=_header(call, "Content-Type"),
        message_key=_header(call, "Message-Id", pattern=True),
        sender=_header(call, "X-Sender"),
    )
    # The answers of a cycle's calls are made by ``message_to_api`` / ``process_to_api`` in their declared shape:
    # sent as they are (``server.check_answers`` checks them against the declared type in the tests).
    answer = AsDeclared(message)
    return answer if created else Reply(answer, status=200)


@routes.get(MAILBOX + "/messages", permission=RECEIVE)
async def list_messages(call: Call, addressee: Name, database: Name, query: MessagesQuery) -> MessageList:
    """API_1: the messages available for processing, oldest first, and whether a process holds the mailbox."""
    return MessageList.model_validate(await messages.list_available(call.ctx, addressee, database, limit=query.limit, cursor=query.cursor))


# The bytes go out with the type their sender stored (any media type), so the description names no one type.
@routes.get(MAILBOX + "/messages/{message_id}", permission=RECEIVE, problems=[MessageNotFound],
            content={"*/*": {"schema": {"type": "string", "format": "binary"}}})
async def read_message(call: Call, addressee: Name, database: Name, message_id: Name) -> Reply:
    """One message's bytes with its content type; ``404 message_not_found`` once committed."""
    message, data = await messages.read_message(call.ctx, addressee, database, message_id)
    return Reply(data, media_type=message["content_type"],
                 headers={"X-Message-Sha256": message["sha256"], "X-Message-Id": message["id"]})


@routes.post(MAILBOX + "/processes", permission=RECEIVE, status=201, problems=[Busy, MessagesUnavailable])
async def start_process(call: Call, addressee: Name, database: Name, body: StartRequest) -> Process | AsDeclared:
    """API_2: start processing all of ``message_ids`` (all or nothing); ``409 busy`` while another
    process holds the mailbox."""
    return AsDeclared(await service.start_process(call.ctx, addressee, database, body.client_id, body.message_ids))


@routes.post("/processes/{process_id}/heartbeat", permission=WORKER, problems=[Cancelled])
async def heartbeat(call: Call, process_id: Name) -> Process:
    """Keep a process alive: a new ``deadline``; ``409 cancelled`` once it is not."""
    return Process.model_validate(await service.heartbeat(call.ctx, process_id))


@routes.post("/processes/{process_id}/ready", permission=All(WORKER, REPLIES), problems=[Cancelled])
async def ready(call: Call, process_id: Name, body: ReadyRequest | None) -> ReadyResponse | AsDeclared:
    """API_3: processed; may commit. Replies are stored but not visible until API_4."""
    process = await service.ready(call.ctx, process_id, body.replies if body else [])
    return AsDeclared({"status": "OK", "process": process})


@routes.post("/processes/{process_id}/committed", permission=COMMITTER, problems=[Cancelled, AlreadyCommitted])
async def committed(call: Call, process_id: Name) -> Process | AsDeclared:
    """API_4: the client's database committed. The messages go, the replies appear."""
    return AsDeclared(await service.committed(call.ctx, process_id))


@routes.post("/processes/{process_id}/commit-failed", permission=READER, problems=[Cancelled, AlreadyCommitted])
async def commit_failed(call: Call, process_id: Name, body: CommitFailedRequest | None) -> Process:
    """API_5: the client's database did not commit. The messages are available again."""
    return Process.model_validate(await service.commit_failed(call.ctx, process_id, body.error if body else None))


@routes.post("/processes/{process_id}/resolve", permission=Scope("admin"), problems=[ProcessNotFound, NotInDoubt])
async def resolve(call: Call, process_id: Name, body: ResolveRequest) -> Process:
    """Administrator: resolve an IN_DOUBT process as API_4 (``committed``) or API_5 would."""
    return Process.model_validate(await service.resolve(call.ctx, process_id, body.committed))


@routes.get("/processes/{process_id}", permission=READER)
async def get_process(call: Call, process_id: Name) -> Process:
    """One process."""
    return Process.model_validate(await service.get_process(call.ctx, process_id))


@routes.get("/processes", permission=Scope("exchange:receive:{addressee}", "admin"))
async def list_processes(call: Call, query: ProcessesQuery) -> ProcessList:
    """Processes, oldest first; filter by state and mailbox. Without ``addressee`` it needs ``admin``."""
    return ProcessList.model_validate(await service.list_processes(call.ctx, state=query.state, addressee=query.addressee, database=query.database,
                                        limit=query.limit, cursor=query.cursor))


@routes.get("/mailboxes", permission=Filtered("mailboxes", lambda box: f"exchange:receive:{box.addressee}",
                                               shown_as="exchange:receive:<addressee>"))
async def list_mailboxes(call: Call) -> MailboxList:
    """Mailboxes the caller may receive from, with their available message counts and active process."""
    return MailboxList.model_validate({"mailboxes": await messages.list_mailboxes(call.ctx)})

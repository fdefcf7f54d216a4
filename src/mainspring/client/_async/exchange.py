"""The exchange client (API.md §1): messages, and the five calls of the processing protocol."""

from __future__ import annotations

import builtins
from typing import cast
from urllib.parse import quote

from mainspring.client._async.base import AsyncBaseClient
from mainspring.client.models import (
    Mailbox,
    MailboxSummary,
    Message,
    Process,
    ProcessPage,
    ReadyAnswer,
    Reply,
)


def _mailbox(addressee: str, database: str) -> str:
    return f"/v1/exchange/mailboxes/{quote(addressee, safe='')}/{quote(database, safe='')}"


def _process(process_id: str) -> str:
    return f"/v1/exchange/processes/{quote(process_id, safe='')}"


class AsyncExchangeClient(AsyncBaseClient):
    """Every call of the exchange. API_3, API_4 and API_5 answer the same when repeated, so they are
    retried; an unkeyed store and API_2 are not (a lost answer would look like a duplicate or ``busy``)."""

    async def store(self, addressee: str, database: str, body: bytes, *, content_type: str | None = None,
                    message_id: str | None = None, sender: str | None = None) -> Message:
        """Store a message in mailbox (addressee, database). With ``message_id`` the call is idempotent."""
        headers = {k: v for k, v in {"Content-Type": content_type, "Message-Id": message_id, "X-Sender": sender}.items() if v}
        answer = await self._json("POST", f"{_mailbox(addressee, database)}/messages", idempotent=message_id is not None,
                                  content=body, headers=headers)
        return cast(Message, answer)

    async def list(self, addressee: str, database: str, limit: int = 100) -> Mailbox:
        """API_1: the mailbox's available messages, oldest first, with ``busy`` and ``active_process_id``."""
        path = f"{_mailbox(addressee, database)}/messages"
        return cast(Mailbox, await self._json("GET", path, idempotent=True, params={"limit": limit}))

    async def read(self, addressee: str, database: str, message_id: str) -> bytes:
        """The bytes of one message."""
        path = f"{_mailbox(addressee, database)}/messages/{quote(message_id, safe='')}"
        return (await self._request("GET", path, idempotent=True)).content

    async def mailboxes(self) -> builtins.list[MailboxSummary]:
        """Every mailbox the token may receive from, with its available count and active process."""
        return cast(dict[str, builtins.list[MailboxSummary]], await self._json("GET", "/v1/exchange/mailboxes", idempotent=True))["mailboxes"]

    async def start(self, addressee: str, database: str, client_id: str, message_ids: builtins.list[str]) -> Process:
        """API_2: start a process over these messages (all or none). Not retried: a lost answer would look
        like ``Busy``; ``ExchangeProcessor`` settles such a process by its client id."""
        answer = await self._json("POST", f"{_mailbox(addressee, database)}/processes", idempotent=False,
                                  json={"client_id": client_id, "message_ids": message_ids})
        return cast(Process, answer)

    async def process(self, process_id: str) -> Process:
        """One process."""
        return cast(Process, await self._json("GET", _process(process_id), idempotent=True))

    async def process_page(self, *, state: str | None = None, addressee: str | None = None, database: str | None = None,
                           limit: int = 100, cursor: str | None = None) -> ProcessPage:
        """One page of processes, oldest first (without ``addressee``: scope ``admin``)."""
        params = {"state": state, "addressee": addressee, "database": database, "limit": limit, "cursor": cursor}
        return cast(ProcessPage, await self._json("GET", "/v1/exchange/processes", idempotent=True, params=params))

    async def processes(self, addressee: str | None = None, database: str | None = None,
                        state: str | None = None) -> builtins.list[Process]:
        """Every process of the mailbox (or all, with scope ``admin``) in ``state``, all pages."""
        found: builtins.list[Process] = []
        cursor: str | None = None
        while True:
            page = await self.process_page(state=state, addressee=addressee, database=database, limit=1000, cursor=cursor)
            found.extend(page["processes"])
            cursor = page.get("next_cursor")
            if not cursor:
                return found

    async def heartbeat(self, process_id: str) -> Process:
        """Keep a STARTED process alive: a new deadline. ``Cancelled`` when it was cancelled."""
        return cast(Process, await self._json("POST", f"{_process(process_id)}/heartbeat", idempotent=True))

    async def ready(self, process_id: str, replies: builtins.list[Reply] | None = None) -> ReadyAnswer:
        """API_3: STARTED → READY_TO_COMMIT, storing ``replies`` (visible once committed)."""
        fields = {"replies": [r.to_api() for r in replies or []]}
        return cast(ReadyAnswer, await self._json("POST", f"{_process(process_id)}/ready", idempotent=True, json=fields))

    async def committed(self, process_id: str) -> Process:
        """API_4: the client's database committed; the messages go, the replies appear."""
        return cast(Process, await self._json("POST", f"{_process(process_id)}/committed", idempotent=True))

    async def commit_failed(self, process_id: str, error: str | None = None) -> Process:
        """API_5: the client's database did not commit; the messages are available again."""
        fields: dict[str, str] = {"error": error} if error else {}
        return cast(Process, await self._json("POST", f"{_process(process_id)}/commit-failed", idempotent=True, json=fields))

    async def resolve(self, process_id: str, committed: bool) -> Process:
        """The administrator's answer for an IN_DOUBT process (scope ``admin``)."""
        answer = await self._json("POST", f"{_process(process_id)}/resolve", idempotent=True, json={"committed": committed})
        return cast(Process, answer)

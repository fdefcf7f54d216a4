"""The direct producer: Python code that shares the database writes into Mainspring without HTTP.

```python
from mainspring import App

app = App()
async with producer(database="postgresql://…/mainspring") as mainspring:
    item = await mainspring.create("emails", data={"to": "ada@example.org"}, message_id="order-17")
    task = await mainspring.submit("books", id="b1-en", group="b1", member="en", content="Chapter 1…")
    message = await mainspring.put("erp", "main", b"<order/>", message_key="order-17")
    answer = await mainspring.call("invoices", "inv-1", {"pay": 100})
```

Its answers are the clients' typed answers (``mainspring.client.models``: ``Interaction``, ``Task``,
``Message``, ``Machine``), field for field what the HTTP API answers, so code moves between the producer and
a client without change. It runs the same service code and data layer as the server's routes — the same validation, the same
transaction with its event, the same wake-ups (NOTIFY on PostgreSQL, the wake-up sockets beside SQLite), so
servers and workers in other processes see the work at once — and gives the same guarantees: when a call
returns, its change is committed. It does not run background work (timers, leases, the events sequencer):
a server does that.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import cast

from pydantic import JsonValue

from mainspring.app import App
from mainspring.batching import service as batching
from mainspring.batching.models import Task, TaskIn
from mainspring.client import models as answers
from mainspring.client.errors import ResultTimeout, error_from_problem, result_of
from mainspring.config import Settings, load_settings
from mainspring.core.errors import ForeignConnection, NeedsPostgres
from mainspring.core.runtime import Context
from mainspring.exchange import messages
from mainspring.exchange.models import Message
from mainspring.interactions import service as interactions
from mainspring.interactions.data import InteractionRow
from mainspring.interactions.models import CreateIn, Interaction
from mainspring.machines import service as machines
from mainspring.machines.namespaces import close_processors
from mainspring.store import Store
from mainspring.store.errors import UnusableConnection
from mainspring.store.migrate import migrate
from mainspring.types import JsonData, JsonInput, JsonObject

RESULT_POLL_S = 30.0
"""How long one wait for a result lasts before it looks again (wake-ups are hints)."""


class Producer:
    """An open connection to the store for writing work directly. Use it as an async context manager (or
    ``open``/``close``); one producer is meant to be shared by a whole process."""

    def __init__(self, settings: Settings, registry: App | None = None) -> None:
        self.settings = settings
        self.store = Store(
            settings.server.database_url(), pool_size=settings.server.pool_size, sqlite_synchronous=settings.server.sqlite_synchronous
        )
        self.context = Context(settings=settings, store=self.store, registry=registry)

    async def open(self) -> Producer:
        """Bring the schema up to date (a no-op when a server already did) and join the wake-ups."""
        await migrate(self.store)
        await self.store.start()
        return self

    async def close(self) -> None:
        await close_processors(self.context)
        await self.store.close()

    async def __aenter__(self) -> Producer:
        return await self.open()

    async def __aexit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def create(self, queue: str, data: JsonInput = None, *, connection: object = None, **fields: object) -> answers.Interaction:
        """Create an interaction in ``queue`` (fields as in ``POST /v1/queues/{queue}/interactions``:
        ``parent_id``, ``name``, ``message_id``, ``channel``, ``user``, ``source``, ``priority``, ``process_at`` or
        ``process_in_ms``, ``completed`` and ``result``). A ``message_id`` already used in the queue answers
        the existing interaction.

        ``connection``: write in the transaction you have open on it (PostgreSQL: an asyncpg ``Connection``, a
        psycopg ``AsyncConnection``, a SQLAlchemy ``AsyncConnection`` or ``AsyncSession``) — the item, its event
        and its wake-up exist once you commit, and not at all if you roll back. A SQLite store refuses it
        (``NeedsPostgres``), a connection to another database too (``ForeignConnection``)."""
        if connection is None:
            new = interactions.new_from(queue, CreateIn.model_validate({"data": data, **fields}), self.store.now_ms())
            row, _ = await interactions.create_row(self.store, self.settings.interactions, new)
            return _answer(row, self.store.now_ms())
        return (await self.create_many(queue, [{"data": data, **fields}], connection=connection))[0]

    async def create_many(self, queue: str, items: Sequence[Mapping[str, object]], *, connection: object = None) -> list[answers.Interaction]:
        """Create interactions in ``queue`` in one transaction, all or none, answered in order: each of
        ``items`` holds ``data`` and the fields of ``create``. ``connection`` as in ``create``."""
        now = self.store.now_ms()
        batch = [interactions.new_from(queue, CreateIn.model_validate(dict(item)), now) for item in items]
        if connection is not None and not self.store.dialect.writes_in_callers_transactions:
            raise NeedsPostgres("this store is SQLite: create without connection= (the producer's own connection writes)")
        try:
            created = await interactions.create_rows(self.store, self.settings.interactions, batch, connection)
        except UnusableConnection as exc:
            raise ForeignConnection(str(exc)) from None
        now = self.store.now_ms()
        return [_answer(row, now) for row, _ in created]

    async def result(self, interaction_id: str, *, timeout_s: float | None = None) -> JsonData:
        """The item's ``result`` once it is completed, as ``InteractionsClient.result``: ``InteractionFailed``
        or ``InteractionCancelled`` when it ends otherwise, ``ResultTimeout`` when ``timeout_s`` passes first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = RESULT_POLL_S if deadline is None else max(0.0, deadline - time.monotonic())
            item = await interactions.wait_finished(self.store, interaction_id, int(min(RESULT_POLL_S, left) * 1000))
            if item["status"] in interactions.FINISHED:
                return result_of(Interaction.model_validate(item).model_dump(mode="json"))
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeout(Interaction.model_validate(item).model_dump(mode="json"), timeout_s or 0)

    async def submit(self, batcher: str, *, id: str, group: str, member: str, content: JsonValue, data: JsonValue = None) -> answers.Task:
        """Submit a task to ``batcher`` (as ``POST /v1/batchers/{batcher}/tasks``). A known id answers the
        stored task; content this member already has answers a task with status ``rejected``, reason
        ``duplicate``."""
        body = TaskIn(id=id, group=group, member=member, content=content, data=data)
        task, _ = await batching.submit_task(self.store, batcher, body, batching.registration_defaults(self.context.registry, batcher))
        return cast(answers.Task, Task.model_validate(task).model_dump(mode="json"))

    async def put(
        self, addressee: str, database: str, body: bytes, *,
        content_type: str | None = None, message_key: str | None = None, sender: str | None = None,
    ) -> answers.Message:
        """Store a message in the mailbox of ``addressee``/``database`` (as ``POST …/messages``): the body is
        written and fsynced in the server's data directory, so the producer must share it. A repeated
        ``message_key`` with the same bytes answers the stored message; with other bytes ``Conflict``."""
        message, _ = await messages.store_message(
            self.context, addressee, database, body, content_type=content_type, message_key=message_key, sender=sender
        )
        return cast(answers.Message, Message.model_validate(message).model_dump(mode="json"))

    async def start(self, namespace: str, machine_id: str, args: JsonValue = None, *, idempotency_key: str | None = None) -> answers.Machine:
        """Start a machine; answers it as ``POST /v1/namespaces/{namespace}/machines`` does."""
        return cast(answers.Machine, self._answer(await machines.start_machine(self.context, namespace, machine_id, args, idempotency_key)))

    async def call(
        self, namespace: str, machine_id: str, args: JsonValue = None, *,
        idempotency_key: str | None = None, timeout_ms: int | None = None,
    ) -> JsonValue:
        """Call a machine; answers the processor's response, with the step committed."""
        answer = self._answer(await machines.call_machine(self.context, namespace, machine_id, args, idempotency_key, timeout_ms))
        return answer["response"]

    async def notify(self, namespace: str, machine_id: str, args: JsonValue = None, *, idempotency_key: str | None = None) -> str:
        """Queue a notification for a machine; answers its id."""
        return str(self._answer(await machines.notify_machine(self.context, namespace, machine_id, args, idempotency_key))["id"])

    @staticmethod
    def _answer(reply: machines.Reply) -> JsonObject:
        # A step's failure is stored as the problem a repeat gets back, so it is raised as the client would.
        if reply.status >= 400:
            raise error_from_problem(reply.status, reply.body)
        return reply.body


def _answer(row: InteractionRow, now: int) -> answers.Interaction:
    """The item as the API answers it. ``to_api`` builds the API's JSON fields already; only an item with an
    ``error_detail`` (an existing one, answered for its ``message_id``) goes through the model, which keeps the
    detail's three fields — a created one skips a validation and a dump (per item of a bulk create)."""
    answer = interactions.to_api(row, now)
    if answer["error_detail"] is not None:
        answer = Interaction.model_validate(answer).model_dump(mode="json")
    return cast(answers.Interaction, answer)


def producer(registry: App | None = None, *, database: str | None = None, data_dir: Path | None = None, config: Path | None = None) -> Producer:
    """A producer for the store that ``config`` (a TOML file, else ``$MAINSPRING_CONFIG``), the environment
    and ``database``/``data_dir`` name, as ``mainspring serve`` resolves them."""
    return Producer(load_settings(config, server={"database": database, "data_dir": data_dir}), registry)

"""The direct producer: Python code that shares the database writes into Mainspring without HTTP.

```python
from mainspring import App

app = App()
async with app.producer(database="postgresql://…/mainspring") as mainspring:
    item = await mainspring.create("emails", data={"to": "ada@example.org"}, message_id="order-17")
```

It runs the same service code and data layer as the server's routes — the same validation, the same
transaction with its event, the same wake-ups (NOTIFY on PostgreSQL, the wake-up sockets beside SQLite), so
servers and workers in other processes see the work at once — and gives the same guarantees: when a call
returns, its change is committed. It does not run background work (timers, leases, the events sequencer):
a server does that.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

from mainspring.config import Settings, load_settings
from mainspring.core.runtime import Context
from mainspring.interactions import service as interactions
from mainspring.interactions.models import CreateIn, Interaction
from mainspring.store import Store
from mainspring.store.migrate import migrate


class Producer:
    """An open connection to the store for writing work directly. Use it as an async context manager (or
    ``open``/``close``); one producer is meant to be shared by a whole process."""

    def __init__(self, settings: Settings, registry: Any = None) -> None:
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
        await self.store.close()

    async def __aenter__(self) -> Producer:
        return await self.open()

    async def __aexit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def create(self, queue: str, data: Any = None, **fields: Any) -> Interaction:
        """Create an interaction in ``queue`` (fields as in ``POST /v1/queues/{queue}/interactions``:
        ``parent_id``, ``name``, ``message_id``, ``channel``, ``user``, ``source``, ``process_at`` or
        ``process_in_ms``, ``completed`` and ``result``). A ``message_id`` already used in the queue answers
        the existing interaction."""
        body = CreateIn.model_validate({"data": data, **fields})
        created, _ = await interactions.create(
            self.store, self.settings.interactions, queue, interactions.spec_from(body, self.store.now_ms())
        )
        return Interaction.model_validate(created)


def producer(registry: Any = None, *, database: str | None = None, data_dir: Path | None = None, config: Path | None = None) -> Producer:
    """A producer for the store that ``config`` (a TOML file, else ``$MAINSPRING_CONFIG``), the environment
    and ``database``/``data_dir`` name, as ``mainspring serve`` resolves them."""
    return Producer(load_settings(config, server={"database": database, "data_dir": data_dir}), registry)

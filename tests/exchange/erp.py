"""A tiny "ERP database" for the client tests: one effect row per processed message (never unique, so a
double effect would show)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

from sqlalchemy import Column, Integer, MetaData, String, Table, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from mainspring.client.exchange import (
    AsyncExchangeClient,
    ExchangeProcessor,
    InboundMessage,
    Reply,
)

erp_metadata = MetaData()
effects = Table(
    "erp_effects",
    erp_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(64), nullable=False),
    Column("body", String(400), nullable=False),
)


def erp_engine(url: str) -> AsyncEngine:
    if url.startswith("sqlite"):
        return create_async_engine(url.replace("sqlite://", "sqlite+aiosqlite://", 1), connect_args={"timeout": 30})
    return create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://", 1))


async def create_schema(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(erp_metadata.create_all)


async def apply_effects(conn: AsyncConnection, messages: list[InboundMessage]) -> list[Reply]:
    """The user's handler: book each message, answer each with a receipt."""
    for message in messages:
        await conn.execute(effects.insert().values(message_id=message.id, body=message.body.decode()))
    return [Reply("mobile-a", "receipts", f"booked {m.id}") for m in messages]


async def effect_counts(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(effects.c.message_id, func.count()).group_by(effects.c.message_id))).all()
    return {r[0]: r[1] for r in rows}


def processor(client: AsyncExchangeClient, engine: AsyncEngine, client_id: str = "gedemin-a") -> ExchangeProcessor:
    return ExchangeProcessor(client, engine, addressee="mobile-a", database="erp-1", client_id=client_id,
                             handler=apply_effects, batch_limit=3)


async def _crash_run(server_url: str, erp_url: str, crash_at: str) -> None:
    engine = erp_engine(erp_url)
    client = AsyncExchangeClient(server_url, attempts=3, max_wait=0.2)
    worker = processor(client, engine)
    await worker.ensure_marker_table()

    def hook(step: str) -> None:
        if step == crash_at:
            print(json.dumps({"crashing_at": step}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    worker.crash_hook = hook
    for _ in range(20):
        await worker.process_once()
    print("never crashed", flush=True)


if __name__ == "__main__":
    asyncio.run(_crash_run(sys.argv[1], sys.argv[2], sys.argv[3]))

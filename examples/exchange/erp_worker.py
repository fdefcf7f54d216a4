"""An ERP-side worker ("Gedemin") that takes orders from a mailbox into its own database exactly once.

    python examples/exchange/erp_worker.py --server http://127.0.0.1:8080 --erp sqlite:///erp.db
    python examples/exchange/erp_worker.py --erp postgresql://postgres@127.0.0.1:5432/erp

Kill it at any moment (Ctrl-C, kill -9) and start it again: every order is booked once, and processes
left undecided are settled from the marker table in the ERP database — no operator needed.

The mailbox is (``--addressee``, the ERP database's own id): made on first use and kept in the ERP database
(``--print-database-id`` shows it, for the producers), unless ``--database`` names one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal

from sqlalchemy import Column, Integer, MetaData, String, Table
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from mainspring.client.exchange import AsyncExchangeClient, ExchangeProcessor, InboundMessage, Reply

metadata = MetaData()
orders = Table(
    "orders",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(64), nullable=False),
    Column("customer", String(200), nullable=False),
    Column("amount", Integer, nullable=False),
)


async def book_orders(conn: AsyncConnection, messages: list[InboundMessage]) -> list[Reply]:
    """Runs inside the ERP transaction; the replies are published only if it commits."""
    receipts = []
    for message in messages:
        order = json.loads(message.body)
        await conn.execute(orders.insert().values(message_id=message.id, customer=order["customer"],
                                                  amount=order["amount"]))
        receipts.append(Reply(addressee=order["customer"], database="receipts",
                              body=json.dumps({"order": message.id, "status": "booked"}),
                              content_type="application/json", message_id=f"receipt-{message.id}"))
    return receipts


def async_url(url: str) -> str:
    if url.startswith("sqlite:"):
        return url.replace("sqlite:", "sqlite+aiosqlite:", 1)
    return url.replace("postgresql://", "postgresql+asyncpg://", 1)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", default="http://127.0.0.1:8080")
    parser.add_argument("--token", default=None)
    parser.add_argument("--erp", default="sqlite:///erp.db", help="the ERP database (SQLite or PostgreSQL URL)")
    parser.add_argument("--addressee", default="erp")
    parser.add_argument("--database", default=None,
                        help="the mailbox's database id (default: the id the ERP database keeps for itself)")
    parser.add_argument("--client-id", default="gedemin-1")
    parser.add_argument("--print-database-id", action="store_true", help="print the mailbox's database id and exit")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    engine = create_async_engine(async_url(args.erp))
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with AsyncExchangeClient(args.server, args.token) as client:
        worker = ExchangeProcessor(client, engine, addressee=args.addressee, database=args.database,
                                   client_id=args.client_id, handler=book_orders, heartbeat_s=30)
        await worker.ensure_marker_table()
        if args.print_database_id:
            print(await worker.database_id())
        else:
            logging.info("taking orders from mailbox %s/%s", args.addressee, await worker.database_id())
            await worker.run(stop)
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())

"""The exchange process read/lock statement built per call against built once: CPU per call, SQLite, in one
process, alternated (issue 36). Run: python -m bench.exchange_process_read"""
import asyncio
import os
import tempfile
import time

from sqlalchemy import select

from mainspring.exchange import data
from mainspring.exchange.tables import exchange_processes as P
from mainspring.store import Store
from mainspring.store.migrate import migrate


async def main():
    d = tempfile.mkdtemp()
    store = Store(f"sqlite+aiosqlite:///{d}/x.db")
    await migrate(store)
    async def old(tx, pid):
        return (await tx.execute(store.dialect.for_update(select(P).where(P.c.id == pid)))).first()
    async def new(tx, pid):
        return await data.lock_process(tx, pid)
    res = {"per-call select": [], "built once": []}
    for _round in range(5):
        for name, f in (("per-call select", old), ("built once", new)):
            async with store.transaction() as tx:
                t = time.process_time()
                for i in range(3000):
                    await f(tx, f"p{i}")
                res[name].append((time.process_time() - t) / 3000 * 1e6)
    for k, v in res.items():
        print(k, " ".join(f"{x:.0f}" for x in v), "µs; median", sorted(v)[2], "load", os.getloadavg()[0])
    await store.close()
asyncio.run(main())

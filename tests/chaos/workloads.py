"""Client workloads for the four faces, each through the project's own Python clients and the proxies.

Every workload has ``setup`` (once, on a healthy cluster), ``produce`` (new work until told to stop),
``work`` (the consumers, until the end of the drain), ``outstanding`` (how much is not finished yet: the
drain waits for 0) and ``read_final`` (what the checker needs). Producers retry an unanswered operation with
the same idempotency key, as a careful client would; each attempt is its own history entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from sqlalchemy import Column, Integer, MetaData, String, Table, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from mainspring.client import AsyncWorkflowsClient
from mainspring.client.batching import AsyncBatchingClient, BatchingError
from mainspring.client.errors import ServiceUnavailable
from mainspring.client.exchange import AsyncExchangeClient, ExchangeError, ExchangeProcessor, InboundMessage
from mainspring.client.interactions import AsyncInteractionsClient, InteractionsError
from mainspring.client.machines import AsyncMachinesClient, MachinesError
from mainspring.machines.host import processor_app
from tests.chaos import flowapp
from tests.chaos.checker import FinalState
from tests.chaos.history import OK, UNKNOWN, History, outcome_of
from tests.conftest import free_port

CLIENT_TIMEOUT = 15.0
LEASE_MS = 10_000
"""Long enough for a loaded CI machine to answer a release inside it; abandoned items wait this long."""
ATTEMPTS = 4


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def _attempts(make: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``make`` until it is answered (ok or refused) or the attempts are spent; each attempt is recorded
    by ``make`` itself. Answers the result, or None."""
    for attempt in range(ATTEMPTS):
        try:
            return await make()
        except Exception as exc:
            refused = isinstance(exc, ServiceUnavailable) and not exc.sent  # never sent: another server may take it
            if (outcome_of(exc) != UNKNOWN and not refused) or attempt == ATTEMPTS - 1:
                return None
            await asyncio.sleep(0.2 * (attempt + 1))
    return None


class Workload:
    face = ""

    def __init__(self, history: History, urls: list[str], direct: str, workdir: Path, rate: float) -> None:
        self.history = history
        self.urls = urls
        self.direct = direct
        self.workdir = workdir
        self.rate = rate
        """New operations per second of this workload's producers (together)."""

    def url(self) -> str:
        return random.choice(self.urls)

    async def setup(self) -> None: ...

    async def produce(self, stop: asyncio.Event) -> None: ...

    async def work(self, stop: asyncio.Event) -> None: ...

    async def outstanding(self) -> int:
        return 0

    async def read_final(self, final: FinalState) -> None: ...

    async def close(self) -> None: ...


# --- exchange ------------------------------------------------------------------------------------------

erp_metadata = MetaData()
effects = Table(
    "erp_effects", erp_metadata,
    # No unique key on purpose: a double delivery must show as two rows, not be hidden by a constraint.
    Column("row_id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(128), nullable=False),
)


async def apply_to_erp(conn: AsyncConnection, messages: list[InboundMessage]) -> None:
    """The ERP's work: one row per message, named by the key the producer put in the body (the server's
    own message id is not known to a producer whose store went unanswered)."""
    for message in messages:
        await conn.execute(effects.insert().values(message_id=json.loads(message.body)["key"]))


class ExchangeWorkload(Workload):
    """Producers store messages into two mailboxes; two ERP consumers per mailbox (each with its own client
    id, one SQLite ERP database per mailbox) take them through the protocol helper."""

    face = "exchange"
    addressee = "erp"
    databases = ("db1", "db2")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.engines = {db: create_async_engine(f"sqlite+aiosqlite:///{self.workdir / f'erp-{db}.sqlite'}",
                                                connect_args={"timeout": 30}) for db in self.databases}
        # The protocol helper's own retries ride out faults; producers retry by hand so each attempt is recorded.
        self.clients = [AsyncExchangeClient(u, timeout=CLIENT_TIMEOUT, attempts=3, max_wait=1) for u in self.urls]
        self.producers = [AsyncExchangeClient(u, timeout=CLIENT_TIMEOUT, attempts=1) for u in self.urls]
        self.seq = count(1)

    async def setup(self) -> None:
        for db, engine in self.engines.items():
            async with engine.begin() as conn:
                await conn.run_sync(erp_metadata.create_all)
            # Once here: two consumers creating the marker table at once race on CREATE TABLE.
            await self._processor(db, 0).ensure_marker_table()

    def _processor(self, db: str, index: int) -> ExchangeProcessor:
        return ExchangeProcessor(self.clients[index % len(self.clients)], self.engines[db], addressee=self.addressee,
                                 database=db, client_id=f"erp-{db}-{index}", handler=self._handler, batch_limit=10,
                                 heartbeat_s=1.0)

    async def produce(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            n = next(self.seq)
            db = random.choice(self.databases)
            message_id = f"x{n}"

            async def store(message_id: str = message_id, db: str = db, n: int = n) -> Any:
                client = random.choice(self.producers)
                with self.history.op("exchange", "store", message_id, mailbox=f"{self.addressee}/{db}"):
                    return await client.store(self.addressee, db, json.dumps({"key": message_id, "n": n}).encode(),
                                              content_type="application/json", message_id=message_id)

            await _attempts(store)
            await _pause(stop, random.expovariate(self.rate))

    async def work(self, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._consume(stop, db, i) for db in self.databases for i in range(2)))

    async def _consume(self, stop: asyncio.Event, db: str, index: int) -> None:
        processor = self._processor(db, index)
        while not stop.is_set():
            # A different server each round: a consumer is not tied to the one that just died.
            processor.client = random.choice(self.clients)
            op_key = f"{db}-{index}"
            try:
                with self.history.op("exchange", "round", op_key, actor=processor.client_id) as op:
                    outcome = await processor.process_once()
                    op.value.update(status=outcome.status, process_id=outcome.process_id, message_ids=outcome.message_ids)
            except Exception:
                outcome = None
            if outcome is None or outcome.status != "committed":
                await _pause(stop, random.uniform(0.3, 1.0))

    @staticmethod
    async def _handler(conn: AsyncConnection, messages: list[InboundMessage]) -> None:
        await apply_to_erp(conn, messages)

    async def outstanding(self) -> int:
        async with httpx.AsyncClient(base_url=self.direct, timeout=10) as http:
            left = 0
            for db in self.databases:
                page = (await http.get(f"/v1/exchange/mailboxes/{self.addressee}/{db}/messages", params={"limit": 1000})).json()
                left += len(page["messages"]) + (1 if page["busy"] else 0)
            for state in ("STARTED", "READY_TO_COMMIT", "IN_DOUBT", "CLEANUP"):
                page = (await http.get("/v1/exchange/processes", params={"state": state, "limit": 1000})).json()
                left += len(page["processes"])
            return left

    async def read_final(self, final: FinalState) -> None:
        for engine in self.engines.values():
            async with engine.connect() as conn:
                rows = await conn.execute(select(effects.c.message_id, func.count()).group_by(effects.c.message_id))
                for message_id, n in rows:
                    final.exchange_effects[message_id] = final.exchange_effects.get(message_id, 0) + n
        async with httpx.AsyncClient(base_url=self.direct, timeout=30) as http:
            for db in self.databases:
                page = (await http.get(f"/v1/exchange/mailboxes/{self.addressee}/{db}/messages", params={"limit": 1000})).json()
                final.exchange_available.update(m["id"] for m in page["messages"])
            for state in ("STARTED", "READY_TO_COMMIT", "IN_DOUBT", "CLEANUP"):
                page = (await http.get("/v1/exchange/processes", params={"state": state, "limit": 1000})).json()
                final.exchange_open_processes.extend(page["processes"])

    async def close(self) -> None:
        for client in [*self.clients, *self.producers]:
            await client.aclose()
        for engine in self.engines.values():
            await engine.dispose()


# --- machines ------------------------------------------------------------------------------------------

TIMERS_PER_MACHINE = 3


class Counter:
    """The processor: every call and notification is one event named by its key; each machine sets
    ``TIMERS_PER_MACHINE`` timers one after another, numbered in its aux state, so a timer fired twice or
    never shows in the history."""

    def init(self, args: Any, machine: dict[str, Any]) -> dict[str, Any]:
        return {"events": [{"created": machine["id"]}], "aux_state": {"timer": 0}, "action": {"timer": {"in_ms": 300}}}

    def call(self, args: Any, machine: dict[str, Any]) -> dict[str, Any]:
        return {"events": [{"call": args["key"]}], "response": {"seen": len(machine.get("history") or [])}}

    def notification(self, args: Any, machine: dict[str, Any]) -> dict[str, Any]:
        return {"events": [{"notify": args["key"]}]}

    def timeout(self, args: Any, machine: dict[str, Any]) -> dict[str, Any]:
        fired = int((machine.get("aux_state") or {}).get("timer", 0)) + 1
        timer = {"in_ms": 300} if fired < TIMERS_PER_MACHINE else None
        return {"events": [{"timer": fired}], "aux_state": {"timer": fired}, "action": {"timer": timer}}


class MachinesWorkload(Workload):
    """Machines of namespace ``counter`` served by an HTTP ``Counter`` processor in this process; producers
    start machines and send calls and notifications, each with an idempotency key."""

    face = "machines"
    ns = "counter"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clients = [AsyncMachinesClient(u, timeout=CLIENT_TIMEOUT, attempts=1) for u in self.urls]
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(processor_app(Counter), host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="off"))
        self.serving: asyncio.Task[None] | None = None
        self.started: list[str] = []
        self.seq = count(1)

    async def setup(self) -> None:
        self.serving = asyncio.create_task(self.server.serve())
        while not self.server.started:  # noqa: ASYNC110 - uvicorn exposes only a flag
            await asyncio.sleep(0.01)
        async with AsyncMachinesClient(self.direct) as client:
            await client.put_namespace(self.ns, url=f"http://127.0.0.1:{self.port}/", timeout_ms=3000,
                                       retry={"initial_ms": 100, "factor": 2, "max_ms": 1000, "max_attempts": None})

    async def produce(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            roll = random.random()
            if roll < 0.15 or not self.started:
                await self._start(f"k{next(self.seq)}")
            else:
                await self._send("call" if roll < 0.65 else "notify", random.choice(self.started), f"{next(self.seq)}")
            await _pause(stop, random.expovariate(self.rate))

    async def _start(self, machine_id: str) -> None:
        async def attempt() -> Any:
            with self.history.op("machines", "start", machine_id):
                return await random.choice(self.clients).start(self.ns, machine_id, {}, idempotency_key=f"start-{machine_id}")

        if await _attempts(attempt) is not None:
            self.started.append(machine_id)

    async def _send(self, kind: str, machine_id: str, n: str) -> None:
        key = f"{kind[0]}{n}"

        async def attempt() -> Any:
            client = random.choice(self.clients)
            with self.history.op("machines", kind, key, machine=machine_id):
                if kind == "call":
                    return await client.call(self.ns, machine_id, {"key": key}, idempotency_key=key)
                return await client.notify(self.ns, machine_id, {"key": key}, idempotency_key=key)

        await _attempts(attempt)

    async def _machines(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        async with AsyncMachinesClient(self.direct, timeout=30) as client:
            ids = [m["id"] async for m in client.list(self.ns, limit=1000)]
            for machine_id in ids:
                machine = await client.get(self.ns, machine_id, limit=100_000)
                found[machine_id] = machine
        return found

    async def outstanding(self) -> int:
        ok_notifies = {op.key for op in self.history.ops if op.face == "machines" and op.kind == "notify" and op.outcome == OK}
        left = 0
        for machine in (await self._machines()).values():
            data = [e.get("data") or {} for e in machine["history"]]
            left += TIMERS_PER_MACHINE - sum(1 for d in data if "timer" in d)
            left += int(machine.get("pending_notifications") or 0)
            ok_notifies -= {d["notify"] for d in data if "notify" in d}
        return left + len(ok_notifies)

    async def read_final(self, final: FinalState) -> None:
        final.timers_per_machine = TIMERS_PER_MACHINE
        for machine_id, machine in (await self._machines()).items():
            final.machines[machine_id] = {"status": machine["status"], "history": machine["history"], "error": machine.get("error")}

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()
        self.server.should_exit = True
        if self.serving:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.serving, 5)


# --- interactions --------------------------------------------------------------------------------------

OWNERS = ("ada", "bo", "cy", "dee", "")
"""The chaos queue's owners (``user``; "" creates items without one), the first a noisy tenant."""
PER_OWNER_CONCURRENCY = 2


class InteractionsWorkload(Workload):
    """Producers create interactions (keyed by ``message_id``) in two queues: ``chaos``, each item for one of a few
    owners, most for a noisy one, with per-owner limits and fair shares on; and ``plain``, without any limit (its
    leases take the one-statement path on PostgreSQL). Two HTTP workers per server lease from both and mostly
    complete what they took, sometimes ask for a retry, sometimes die holding the lease. A lease of ``chaos`` a
    worker released with a 2xx was held from its answer to its release, so more of one owner's held at once is a
    limit exceeded."""

    face = "interactions"
    queue = "chaos"
    plain = "plain"
    queues = (queue, plain)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clients = [AsyncInteractionsClient(u, timeout=CLIENT_TIMEOUT, attempts=1) for u in self.urls]
        self.seq = count(1)
        self.held: list[tuple[str, float, float]] = []
        """(owner, lease answered, release sent) of each lease released with a 2xx (monotonic seconds)."""

    async def setup(self) -> None:
        async with AsyncInteractionsClient(self.direct) as client:
            await client.put_queue(self.queue, lease_ms=LEASE_MS, error_delay_ms=200, max_attempts=1_000_000, owner_by="user",
                                   fair=True, weights={"ada": 2}, per_owner={"concurrency": PER_OWNER_CONCURRENCY,
                                                                            "rate_limit": {"count": 200, "per_ms": 1000}})
            await client.put_queue(self.plain, lease_ms=LEASE_MS, error_delay_ms=200, max_attempts=1_000_000)

    async def produce(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            key = f"i{next(self.seq)}"

            queue = random.choice(self.queues)

            async def create(key: str = key, queue: str = queue) -> Any:
                with self.history.op("interactions", "create", key, queue=queue) as op:
                    owner = OWNERS[0] if random.random() < 0.5 else random.choice(OWNERS)
                    item = await random.choice(self.clients).create(queue, data={"key": key}, message_id=key, user=owner or None)
                    op.value["id"] = item["id"]
                    return item

            await _attempts(create)
            await _pause(stop, random.expovariate(self.rate))

    async def work(self, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._worker(stop, i) for i in range(2 * len(self.clients))))

    async def _worker(self, stop: asyncio.Event, index: int) -> None:
        for turn in count():
            if stop.is_set():
                return
            client = self.clients[(index + random.randrange(2)) % len(self.clients)]
            queue = self.queues[(index + turn) % len(self.queues)]
            try:
                page = await client.lease(queue, worker=f"w{index}", max=5, wait_ms=500)
            except Exception:
                await _pause(stop, 0.2)
                continue
            if not page["interactions"]:
                await _pause(stop, 0.3)
            answered = time.monotonic()
            for item in page["interactions"]:
                await self._handle(client, item, answered)

    def _held(self, item: dict[str, Any], answered: float, sent: float) -> None:
        """A lease released with a 2xx, of the queue whose owners have a limit."""
        if item["queue"] == self.queue:
            self.held.append((item["user"] or "", answered, sent))

    async def _handle(self, client: AsyncInteractionsClient, item: dict[str, Any], answered: float) -> None:
        roll = random.random()
        token = item["lease"]["token"]
        if roll < 0.05:
            return  # the worker "died": the lease runs out and the item is retried
        if roll < 0.15:
            with contextlib.suppress(Exception), self.history.op("interactions", "retry", item["id"]):
                sent = time.monotonic()
                await client.release(item["id"], token, {"retry": {"error": "chaos says retry"}})
                self._held(item, answered, sent)
            return

        async def complete() -> Any:
            with self.history.op("interactions", "complete", item["id"]):
                sent = time.monotonic()
                done = await client.release(item["id"], token, {"complete": {"result": {"by": "chaos"}}})
                self._held(item, answered, sent)
                return done

        await _attempts(complete)

    async def outstanding(self) -> int:
        left = 0
        async with AsyncInteractionsClient(self.direct) as client:
            for queue in self.queues:
                counts = (await client.get_queue(queue)).get("counts") or {}
                left += sum(n for status, n in counts.items() if status != "completed")
        return left

    async def read_final(self, final: FinalState) -> None:
        final.interaction_leases_held = list(self.held)
        final.interaction_owner_concurrency = PER_OWNER_CONCURRENCY
        async with httpx.AsyncClient(base_url=self.direct, timeout=30) as http:
            for queue in self.queues:
                cursor = None
                while True:
                    params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
                    page = (await http.get(f"/v1/queues/{queue}/interactions", params=params)).json()
                    for item in page["interactions"]:
                        final.interactions[item["message_id"]] = {"id": item["id"], "status": item["status"]}
                    cursor = page.get("next_cursor")
                    if not cursor:
                        break
            after = None
            while True:
                params = {"types": "interaction.completed", "limit": 1000, **({"after": after} if after else {})}
                page = (await http.get("/v1/events", params=params)).json()
                if not page["events"]:
                    break
                for event in page["events"]:
                    subject = event["subject"]["id"]
                    final.interaction_completed_events[subject] = final.interaction_completed_events.get(subject, 0) + 1
                after = page["next_cursor"]

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()


# --- batching ------------------------------------------------------------------------------------------

DUPLICATE_SHARE = 0.2
"""Of the batching producers' submits, those repeating an earlier task's group, member and content under a new
id: answered ``rejected`` (duplicate) when that content was accepted, and then never to be in a package."""


class BatchingWorkload(Workload):
    """Producers submit single-member tasks, some of them repeating earlier content under a new id; one HTTP worker
    per server claims packages and mostly completes them, sometimes fails them for a retry, sometimes dies holding
    the lease."""

    face = "batching"
    name = "chaos"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clients = [AsyncBatchingClient(u, timeout=CLIENT_TIMEOUT, attempts=1) for u in self.urls]
        self.seq = count(1)

    async def setup(self) -> None:
        async with AsyncBatchingClient(self.direct) as client:
            await client.put_batcher(self.name, min_size=2, max_size=6, linger_ms=300, max_wait_ms=2000, group_size=1,
                                     incomplete_group="reject", lease_ms=LEASE_MS)

    async def produce(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            n = next(self.seq)
            task_id = f"t{n}"
            # The group and content of an earlier task, now and then: the same content again.
            same = random.randrange(1, n) if n > 1 and random.random() < DUPLICATE_SHARE else n
            repeats = f"t{same}" if same != n else None

            async def submit(task_id: str = task_id, same: int = same, repeats: str | None = repeats) -> Any:
                with self.history.op("batching", "submit", task_id, repeats=repeats) as op:
                    task = await random.choice(self.clients).submit(self.name, id=task_id, group=f"g{same}", member="a",
                                                                    content=f"content {same}")
                    op.value.update(status=task["status"], reason=task.get("reason"))
                    return task

            await _attempts(submit)
            await _pause(stop, random.expovariate(self.rate))

    async def work(self, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._worker(stop, i) for i in range(len(self.clients))))

    async def _worker(self, stop: asyncio.Event, index: int) -> None:
        while not stop.is_set():
            client = self.clients[(index + random.randrange(2)) % len(self.clients)]
            try:
                package = await client.claim(self.name, worker=f"w{index}", wait_ms=500)
            except Exception:
                await _pause(stop, 0.2)
                continue
            if package is None:
                await _pause(stop, 0.3)
                continue
            await self._handle(client, package)

    async def _handle(self, client: AsyncBatchingClient, package: dict[str, Any]) -> None:
        roll = random.random()
        token = package["lease"]["token"]
        task_ids = [t["id"] for t in package["tasks"]]
        if roll < 0.05:
            return
        if roll < 0.15:
            with contextlib.suppress(Exception), self.history.op("batching", "fail", package["id"], task_ids=task_ids):
                await client.fail(package["id"], token, "chaos says retry", retry=True)
            return

        async def complete() -> Any:
            with self.history.op("batching", "complete", package["id"], task_ids=task_ids):
                return await client.complete(package["id"], token)

        await _attempts(complete)

    async def outstanding(self) -> int:
        async with AsyncBatchingClient(self.direct) as client:
            counts = (await client.get_batcher(self.name)).get("counts") or {}
        return sum(int(counts.get(status, 0)) for status in ("pending", "packed", "claimed"))

    async def read_final(self, final: FinalState) -> None:
        async with httpx.AsyncClient(base_url=self.direct, timeout=30) as http:
            cursor = None
            while True:
                params: dict[str, Any] = {"limit": 1000, "status": "done", **({"cursor": cursor} if cursor else {})}
                page = (await http.get(f"/v1/batchers/{self.name}/packages", params=params)).json()
                for package in page["packages"]:
                    final.batch_packages[package["id"]] = {"status": package["status"], "task_ids": [t["id"] for t in package["tasks"]]}
                cursor = page.get("next_cursor")
                if not cursor:
                    break
            keys = {op.key for op in self.history.ops if op.face == "batching" and op.kind == "submit"}
            semaphore = asyncio.Semaphore(16)

            async def read(task_id: str) -> None:
                async with semaphore:
                    reply = await http.get(f"/v1/batchers/{self.name}/tasks/{task_id}")
                if reply.status_code == 200:
                    task = reply.json()
                    final.batch_tasks[task_id] = {"status": task["status"], "package_id": task["package_id"]}

            await asyncio.gather(*(read(k) for k in keys))

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()


# --- workflows -----------------------------------------------------------------------------------------

WORKFLOW_FINISHED = ("completed", "failed", "cancelled")


class WorkflowsWorkload(Workload):
    """Producers start runs of ``chaosflow`` (served by every server: ``serve --app tests.chaos.flowapp:app``),
    each a few steps and a durable sleep, retrying an unanswered start with the same run id (start is idempotent
    by id). The steps log every call of their function to a shared file, so the checker sees which ran twice."""

    face = "workflows"
    name = "chaosflow"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clients = [AsyncWorkflowsClient(u, timeout=CLIENT_TIMEOUT, attempts=1) for u in self.urls]
        self.seq = count(1)

    async def produce(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            run_id = f"f{next(self.seq)}"

            async def start(run_id: str = run_id) -> Any:
                with self.history.op("workflows", "start", run_id) as op:
                    run = await random.choice(self.clients).start(self.name, {"sleep_ms": 300}, id=run_id)
                    op.value["status"] = run["status"]
                    return run

            await _attempts(start)
            await _pause(stop, random.expovariate(self.rate))

    async def _runs(self, with_steps: bool) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        async with AsyncWorkflowsClient(self.direct, timeout=30) as client:
            async for run in client.list(self.name, limit=1000):
                found[run["id"]] = dict(run)
            if with_steps:
                semaphore = asyncio.Semaphore(16)

                async def read(run_id: str) -> None:
                    async with semaphore:
                        found[run_id] = dict(await client.get(self.name, run_id))

                await asyncio.gather(*(read(run_id) for run_id in found))
        return found

    async def outstanding(self) -> int:
        return sum(1 for run in (await self._runs(False)).values() if run["status"] not in WORKFLOW_FINISHED)

    async def read_final(self, final: FinalState) -> None:
        final.workflow_steps = flowapp.STEPS
        for run_id, run in (await self._runs(True)).items():
            final.workflow_runs[run_id] = {"status": run["status"], "result": run.get("result"), "error": run.get("error"),
                                           "steps": run.get("steps") or []}
        path = flowapp.calls_path(self.workdir)
        if path.exists():
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                if "started" in entry:
                    final.workflow_processes[int(entry["started"])] = float(entry["at"])
                else:
                    final.workflow_calls.append(entry)

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()


ALL = (ExchangeWorkload, MachinesWorkload, InteractionsWorkload, BatchingWorkload, WorkflowsWorkload)
__all__ = ["ALL", "BatchingError", "ExchangeError", "InteractionsError", "MachinesError"]

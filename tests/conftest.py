"""Fixtures every face's tests use: a fresh database per test on each engine, a manual clock, the app.

Each test gets its own database: SQLite copies a migrated template file; PostgreSQL creates a database
from a migrated template database (``CREATE DATABASE … TEMPLATE``), and drops it afterwards.
Set ``MAINSPRING_TEST_ENGINES=sqlite`` (or ``postgres``) to run one engine only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from alembic import command
from sqlalchemy import Connection, event

from mainspring.api import create_app
from mainspring.app import App
from mainspring.config import Settings, load_settings
from mainspring.store import ManualClock, Store
from mainspring.store.migrate import alembic_config, migrate

PG_ADMIN = os.environ.get("MAINSPRING_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
ENGINES = [e for e in os.environ.get("MAINSPRING_TEST_ENGINES", "sqlite,postgres").split(",") if e]
_counter = itertools.count()
RUN_ID = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"


def pg_url(database: str) -> str:
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + database


async def _pg_admin(*statements: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def _migrate(url: str) -> None:
    async def run() -> None:
        store = Store(url)
        try:
            await migrate(store)
        finally:
            await store.close()

    asyncio.run(run())


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    _migrate(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    name = f"mst_tpl_{RUN_ID}"
    asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}"', f'CREATE DATABASE "{name}"'))
    _migrate(pg_url(name))
    yield name
    asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    if engine == "sqlite":
        path = tmp_path / "mainspring.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    template = request.getfixturevalue("pg_template")
    name = f"mst_{RUN_ID}_{next(_counter)}"
    asyncio.run(_pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    yield pg_url(name)
    asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return load_settings(
        None,
        server={"database": database_url, "data_dir": tmp_path / "data", "poll_interval_ms": 200, "sqlite_synchronous": "NORMAL",
                "check_answers": True},
    )


@pytest.fixture
async def store(database_url: str, clock: ManualClock) -> AsyncIterator[Store]:
    store = Store(database_url, clock=clock, pool_size=5, sqlite_synchronous="NORMAL")
    await store.start()
    yield store
    await store.close()


@pytest.fixture
def registry() -> App:
    """The user code the test app runs; tests register handlers on it before using ``client``."""
    return App()


@pytest.fixture
async def app(settings: Settings, store: Store, registry: App) -> AsyncIterator[Any]:
    application = create_app(settings, store=store, registry=registry)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://mainspring.test", timeout=30) as c:
        yield c


@contextlib.asynccontextmanager
async def quiet_app_client(settings: Settings, store: Store, registry: App | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The API without its background loops, whose own statements would be counted too, with the token cache
    kept for the whole test (its background refresh is a statement too), once LISTEN is connected: its first
    connect wakes every waiter once (by design: a wake-up sent before it may be lost), the token cache's
    included, which then reads the tokens again — one statement more, counted if it lands among a test's
    measured requests."""
    steady = settings.model_copy(update={"auth": settings.auth.model_copy(update={"cache_ms": 600_000})})
    app = create_app(steady, store=store, registry=registry, run_background=False)
    async with app.router.lifespan_context(app):
        await store.listening()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://mainspring.test") as client:
            yield client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def eventually(check: Callable[[], Awaitable[Any]], within_s: float = 10.0, what: str = "condition") -> Any:
    """Poll ``check`` (real time: the background loops run on their own schedule) until it answers truthy."""
    deadline = time.monotonic() + within_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


LOG_TAIL_CHARS = 8000
_logs_of_this_test: list[tuple[str, Path]] = []


def show_log_on_failure(name: str, path: Path) -> None:
    """Keep the log of a process the running test spawned (a server, a worker): if the test fails, its report ends
    with the log's tail, so an answer such as a 503 explains itself."""
    _logs_of_this_test.append((name, path))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        for name, path in _logs_of_this_test:
            tail = path.read_text(errors="replace")[-LOG_TAIL_CHARS:] if path.exists() else "(no log was written)"
            report.sections.append((f"{name}: the tail of {path}", tail))
    if report.when == "teardown":
        _logs_of_this_test.clear()


class ServerProcess:
    """A real ``mainspring serve`` in a child process, for multi-server, SIGKILL and SIGTERM tests. Its output goes
    to a log file beside its data directory, kept after the test; a failing test shows its tail."""

    def __init__(self, database_url: str, data_dir: Path, env: dict[str, str] | None = None, args: list[str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = database_url
        self.data_dir = data_dir
        self.env = {**os.environ, "MAINSPRING_SERVER__POLL_INTERVAL_MS": "200", **(env or {})}
        self.args = args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"server-{self.port}.log"

    def start(self, wait: bool = True) -> ServerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        show_log_on_failure(f"server {self.url}", self.log_path)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mainspring.cli", "serve", "--port", str(self.port), "--database", self.database_url, "--data-dir", str(self.data_dir), *self.args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 120, url: str | None = None, verify: Any = True) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get((url or self.url) + "/readyz", timeout=1, verify=verify).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server on {self.port} not ready:\n{self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.terminate()
        return self.proc.wait(30)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


@pytest.fixture
def servers(database_url: str, tmp_path: Path) -> Iterator[Any]:
    """Start servers with ``servers(n, env=…)``; all are killed at the end of the test."""
    started: list[ServerProcess] = []

    def start(count: int = 1, env: dict[str, str] | None = None, args: list[str] | None = None, data_dir: Path | None = None, wait: bool = True) -> list[ServerProcess]:
        new = [ServerProcess(database_url, data_dir or tmp_path / "data", env, args).start(wait=False) for _ in range(count)]
        for server in new:
            if wait:
                server.wait_ready()
        started.extend(new)
        return new

    yield start
    for server in started:
        server.kill()


@pytest.fixture
async def live_url(app: Any) -> AsyncIterator[str]:
    """The test app served by uvicorn on a free port, for what needs a real socket (SSE, streaming)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_config=None))
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn exposes only a flag
        await asyncio.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await asyncio.wait_for(task, 10)


def upgrade_to(target: str) -> Callable[[Connection], None]:
    """For ``Store.run_sync``: migrate up to ``target`` only (a store as an older version left it)."""

    def work(connection: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, target)

    return work


@pytest.fixture
def blank_database_url(engine: str, tmp_path: Path) -> Iterator[str]:
    """An empty database, not migrated (migration tests build it up revision by revision)."""
    if engine == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    name = f"mst_migration_{tmp_path.name[-20:]}".replace("-", "_")
    asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}"', f'CREATE DATABASE "{name}"'))
    yield pg_url(name)
    asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def assert_counts_exact(store: Store, counts: Any, kind: str, source: Any, status: str,
                              group: str | tuple[str, ...] | None = None) -> dict[tuple[str, str], int]:
    """The kept counts (``store.counts``) of ``kind`` equal a count of ``source``'s rows themselves (grouped by
    one column or several); answers them."""
    from functools import reduce

    from sqlalchemy import func, literal, select, text

    from mainspring.store import counts as kept_counts

    columns = [source.c[c] for c in ((group,) if isinstance(group, str) else group or ())]
    grp = reduce(lambda joined, c: joined + kept_counts.GROUP_SEPARATOR + c, columns) if columns else literal("")
    counted = select(grp, source.c[status], func.count()).group_by(grp, source.c[status])
    if store.is_postgres:
        # Both reads in one snapshot: each statement of a PostgreSQL read has its own, and a server's background
        # loop (a claim or lease expiring on the test's clock) may move a row and its count between two of them.
        async with store.transaction() as tx:
            await tx.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
            rows = (await tx.execute(counted)).all()
            kept = await kept_counts.read_counts(tx, counts, kind)
    else:
        async with store.read() as conn:  # a snapshot on SQLite
            rows = (await conn.execute(counted)).all()
            kept = await kept_counts.read_counts(conn, counts, kind)
    assert kept == {(str(g), str(s)): int(n) for g, s, n in rows}
    return kept


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool | int | float):
        return str(value)
    if isinstance(value, list | tuple):
        return "ARRAY[" + ", ".join(_literal(v) for v in value) + "]"
    return "'" + str(value).replace("'", "''") + "'"


@contextlib.contextmanager
def statements_sent(store: Store) -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """The statements (and their parameters) SQLAlchemy sends to ``store`` while the block runs — not those
    sent straight on asyncpg (``Transaction.fetch``), which a test reads another way."""
    sent: list[tuple[str, tuple[Any, ...]]] = []

    def keep(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        sent.append((statement, tuple(parameters or ())))

    sync_engine = store.backend.engine.sync_engine  # type: ignore[attr-defined]
    event.listen(sync_engine, "before_cursor_execute", keep)
    try:
        yield sent
    finally:
        event.remove(sync_engine, "before_cursor_execute", keep)


async def generic_plan(database_url: str, statement: str, parameters: tuple[Any, ...]) -> str:
    """PostgreSQL's generic plan of ``statement`` (what a prepared statement runs from its sixth execution),
    EXPLAINed with ``parameters``."""
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE checked AS {statement}")
        args = f"({', '.join(_literal(p) for p in parameters)})" if parameters else ""
        rows = await conn.fetch(f"EXPLAIN EXECUTE checked{args}")
        return "\n".join(r[0] for r in rows)
    finally:
        await conn.close()

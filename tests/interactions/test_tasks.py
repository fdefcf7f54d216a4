"""Typed tasks (issue 35): ``@app.task`` answers a handle whose ``enqueue``/``defer`` check the arguments against
the function's signature before anything is written, and whose items' results come back with
``result(timeout_s=…)`` — through the producer, the async client and the blocking client, on both engines."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mainspring.app import App, NoSender, TaskArgumentsError
from mainspring.client import AsyncInteractionsClient, InteractionFailed, InteractionsClient, ResultTimeout
from mainspring.interactions.worker import Worker
from mainspring.producer import Producer, producer
from mainspring.store import Store


def tasks_app() -> App:
    app = App()

    @app.task(max_attempts=1)
    async def send_email(to: str, subject: str = "hello", copies: int = 1) -> dict[str, Any]:
        if to == "nobody":
            raise ValueError("no such mailbox")
        return {"sent": to, "subject": subject, "copies": copies}

    @app.task("reports")
    def build_report(rows: list[int]) -> int:  # a sync function runs in a thread
        return sum(rows)

    @app.task("slow")
    async def slow(n: int) -> int:
        await asyncio.sleep(60)
        return n

    return app


@contextlib.asynccontextmanager
async def working(app: App, store: Store, settings: Any, *queues: str) -> AsyncIterator[None]:
    worker = Worker(store, app, settings.interactions, poll_ms=200)
    await worker.start()
    try:
        yield
    finally:
        await worker.stop(graceful=False)


async def count_items(store: Store) -> int:
    from mainspring.interactions import service

    return sum((await service.count_by_status(store)).total().values())


@pytest.fixture
async def mainspring(database_url: str, tmp_path: Path) -> AsyncIterator[Producer]:
    async with producer(database=database_url, data_dir=tmp_path) as opened:
        yield opened


async def test_the_producer_refuses_data_neither_engine_can_store_and_writes_nothing(mainspring: Producer) -> None:
    from pydantic import ValidationError

    for data in (float("nan"), float("inf"), {"a": "\ud800"}, ["a\x00b"], {"\x00": 1}):
        with pytest.raises(ValidationError):
            await mainspring.create("q", data)
        with pytest.raises(ValidationError):
            await mainspring.create_many("q", [{"data": 1}, {"data": data}])
    assert await count_items(mainspring.store) == 0
    await mainspring.create("q", {"unicode": "\u00e9\U0001f600", "n": 1.5, "nested": [[{"a": None}]]})
    assert await count_items(mainspring.store) == 1


async def test_a_task_enqueued_through_the_producer_gives_back_its_functions_result(mainspring: Producer) -> None:
    app = tasks_app().use(mainspring)
    send_email, build_report = app.tasks["send_email"], app.tasks["reports"]
    async with working(app, mainspring.store, mainspring.settings):
        job = await send_email.enqueue(to="ada@example.com", copies=2)
        report = await build_report.enqueue([1, 2, 3])   # positional arguments are sent by name
        assert job.item["data"] == {"to": "ada@example.com", "copies": 2} and report.item["data"] == {"rows": [1, 2, 3]}
        assert await job.result(timeout_s=10) == {"sent": "ada@example.com", "subject": "hello", "copies": 2}
        assert await report.result(timeout_s=10) == 6


async def test_wrong_task_arguments_are_refused_before_anything_is_written(mainspring: Producer) -> None:
    app = tasks_app().use(mainspring)
    send_email = app.tasks["send_email"]
    for args, kwargs in (((), {"to": "ada", "colour": "red"}), ((), {"subject": "no recipient"}), ((), {"to": "ada", "copies": "many"}),
                         (("a", "b", 3, 4), {})):
        with pytest.raises(TaskArgumentsError) as refused:
            await send_email.enqueue(*args, **kwargs)
        assert refused.value.code == "invalid_task_arguments"
    assert await count_items(mainspring.store) == 0


async def test_a_failed_task_raises_its_error_and_a_slow_one_times_out(mainspring: Producer) -> None:
    app = tasks_app().use(mainspring)
    async with working(app, mainspring.store, mainspring.settings):
        failing = await app.tasks["send_email"].enqueue(to="nobody")
        with pytest.raises(InteractionFailed) as failed:
            await failing.result(timeout_s=10)
        slow = await app.tasks["slow"].enqueue(n=1)
        with pytest.raises(ResultTimeout) as late:
            await slow.result(timeout_s=0.3)
    assert failed.value.code == "interaction_failed" and failed.value.error_detail["type"] == "ValueError"
    assert isinstance(late.value, TimeoutError) and late.value.code == "result_timeout"


async def test_a_configured_task_keeps_its_message_id_and_priority(mainspring: Producer) -> None:
    app = tasks_app().use(mainspring)
    once = app.tasks["send_email"].configure(message_id="welcome-ada", priority=7)
    first = await once.enqueue(to="ada")
    again = await once.enqueue(to="ada")
    assert first.id == again.id and first.item["priority"] == 7
    with pytest.raises(TaskArgumentsError):
        app.tasks["send_email"].configure(colour="red")


async def test_a_task_without_a_sender_or_with_the_wrong_kind_says_so(mainspring: Producer) -> None:
    app = tasks_app()
    with pytest.raises(NoSender):
        await app.tasks["send_email"].enqueue(to="ada")
    with pytest.raises(NoSender):
        app.tasks["send_email"].using(mainspring).defer(to="ada")
    assert await count_items(mainspring.store) == 0


async def test_a_task_given_a_connection_refuses_a_client_before_writing(live_url: str, mainspring: Producer) -> None:
    app = tasks_app()
    async with AsyncInteractionsClient(live_url) as client:
        with pytest.raises(NoSender, match="needs a producer"):
            await app.tasks["send_email"].configure(connection=object()).using(client).enqueue(to="ada")
    assert await count_items(mainspring.store) == 0


async def test_the_clients_defer_enqueue_and_wait_for_results(live_url: str, store: Store, settings: Any, registry: App) -> None:
    app = tasks_app()
    async with working(app, store, settings), AsyncInteractionsClient(live_url) as client:
        job = await app.tasks["send_email"].using(client).enqueue(to="bob")
        assert (await job.result(timeout_s=10))["sent"] == "bob"
        assert await client.result(job.id) == {"sent": "bob", "subject": "hello", "copies": 1}

        def blocking() -> int:
            with InteractionsClient(live_url) as sync_client:
                deferred = app.use(sync_client).tasks["reports"].defer(rows=[4, 5])
                return int(deferred.result(timeout_s=10))

        assert await asyncio.to_thread(blocking) == 9


def test_mypy_checks_a_tasks_arguments_and_types_its_result(tmp_path: Path) -> None:
    from mypy import api

    source = tmp_path / "typed_task.py"
    source.write_text(
        "from mainspring.app import App\n"
        "app = App()\n"
        "@app.task()\n"
        "async def send_email(to: str, copies: int = 1) -> dict[str, int]:\n"
        "    return {'n': copies}\n"
        "async def main() -> None:\n"
        "    job = await send_email.enqueue(to='ada')\n"
        "    reveal_type(await job.result(timeout_s=1))\n"
        "    await send_email.enqueue(colour='red')\n"
    )
    out, _, _ = api.run(["--strict", "--follow-imports=silent", str(source)])
    assert 'Revealed type is "dict[str, int]"' in out
    assert 'Unexpected keyword argument "colour" for "enqueue"' in out
    assert out.count("error:") == 1


def test_mypy_accepts_a_producer_and_both_clients_as_an_apps_sender(tmp_path: Path) -> None:
    from mypy import api

    source = tmp_path / "senders.py"
    source.write_text(
        "import mainspring\n"
        "from mainspring.app import App\n"
        "from mainspring.client import AsyncInteractionsClient, InteractionsClient\n"
        "app = App()\n"
        "app.use(mainspring.producer())\n"
        "app.use(AsyncInteractionsClient('http://127.0.0.1:1'))\n"
        "app.use(InteractionsClient('http://127.0.0.1:1'))\n"
        "@app.task()\n"
        "def ping() -> None: ...\n"
        "ping.using(InteractionsClient('http://127.0.0.1:1'))\n"
        "app.use(object())\n"
    )
    out, _, _ = api.run(["--strict", "--follow-imports=silent", "--no-incremental", str(source)])
    assert out.count("error:") == 1, out
    assert 'senders.py:11: error: Argument 1 to "use" of "App"' in out, out


def test_the_tasks_of_the_docs_are_the_example_the_docs_server_runs() -> None:
    from tests.docs.harness import ROOT

    example = (ROOT / "examples" / "interactions" / "tasks.py").read_text()
    code = example[example.index("from mainspring import App"):]
    assert code in (ROOT / "docs" / "interactions.md").read_text()


async def test_a_task_enqueued_in_a_rolled_back_transaction_leaves_nothing(engine: str, mainspring: Producer, database_url: str) -> None:
    if engine != "postgres":
        pytest.skip("writing in the caller's transaction is PostgreSQL's")
    import asyncpg

    app = tasks_app().use(mainspring)
    conn = await asyncpg.connect(database_url)
    try:
        transaction = conn.transaction()
        await transaction.start()
        job = await app.tasks["send_email"].configure(connection=conn).enqueue(to="ada")
        await transaction.rollback()
    finally:
        await conn.close()
    assert job.id and await count_items(mainspring.store) == 0

"""Every example in examples/ runs as its docstring says, against a real ``mainspring serve``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mainspring.client import BatchingClient, ExchangeClient, InteractionsClient, MachinesClient
from tests.conftest import ServerProcess, free_port
from tests.docs.harness import ROOT

pytestmark = pytest.mark.slow


def serve(database_url: str, tmp_path: Path, app: str) -> ServerProcess:
    return ServerProcess(database_url, tmp_path / "data", env={"PYTHONPATH": str(ROOT)}, args=["--app", app]).start()


def example(*args: str, cwd: Path = ROOT, **options: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, *args], cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120, **options)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def until(check: Any, within_s: float = 60, what: str = "condition") -> Any:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_interactions_example_pays_an_order_through_a_child_payment(database_url: str, tmp_path: Path) -> None:
    server = serve(database_url, tmp_path, "examples.interactions.app:app")
    try:
        with InteractionsClient(server.url) as client:
            client.put_queue("payments", error_delay_ms=50)   # the example's bank fails one call in five
            order = client.create("orders", {"total": 12})
            done = until(lambda: (i := client.get(order["id"], wait_ms=5000))["status"] == "completed" and i, what="the order")
            assert done["result"] == {"paid": {"charged": 12}}
            [payment] = client.children(order["id"], "payment")["interactions"]
            assert payment["status"] == "completed"
    finally:
        server.kill()


def test_the_batching_example_packs_a_pair_of_books_and_splits_them(database_url: str, tmp_path: Path) -> None:
    server = serve(database_url, tmp_path, "examples.batching.books:app")
    try:
        submitted = example("-m", "examples.batching.books", "submit", "79", "--url", server.url)
        assert "79-en pending" in submitted.stdout and "79-ru pending" in submitted.stdout
        with BatchingClient(server.url) as client:
            tasks = until(lambda: (t := [client.task("books", f"79-{m}") for m in ("en", "ru")]) and all(x["status"] == "done" for x in t) and t,
                          what="both books done")
            assert {t["package_id"] for t in tasks} == {tasks[0]["package_id"]}, "a pair travels in one package"
            assert tasks[0]["result"] == {"sentences": 2, "version": 1}
    finally:
        server.kill()


def test_the_machines_example_runs_in_process_and_over_http(database_url: str, tmp_path: Path) -> None:
    server = serve(database_url, tmp_path, "examples.machines.invoices:app")
    port = free_port()
    processor = subprocess.Popen([sys.executable, "-m", "examples.machines.invoices", "--port", str(port)], cwd=ROOT,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with MachinesClient(server.url) as mg:
            mg.start("invoices", "inv-1", {"amount": 100}, idempotency_key="inv-1")
            assert mg.call("invoices", "inv-1", {"amount": 60}) == {"paid": 60}
            mg.put_namespace("invoices-http", url=f"http://127.0.0.1:{port}/", timeout_ms=5000)
            until(lambda: _starts(mg), what="the HTTP processor")
            assert mg.call("invoices-http", "inv-2", {"amount": 100}) == {"paid": 100}
            history = [e["data"] for e in mg.get("invoices-http", "inv-2")["history"]]
            assert history == [{"issued": {"amount": 100}}, {"paid": 100}, "settled"]
    finally:
        processor.terminate()
        processor.wait(10)
        server.kill()


def _starts(mg: MachinesClient) -> bool:
    from mainspring.client import ServiceUnavailable

    try:
        mg.start("invoices-http", "inv-2", {"amount": 100}, idempotency_key="inv-2")
        return True
    except ServiceUnavailable:   # 502 while the processor is still starting
        return False


def test_the_exchange_example_books_every_order_once(database_url: str, tmp_path: Path) -> None:
    server = ServerProcess(database_url, tmp_path / "data").start()
    erp = f"sqlite:///{tmp_path / 'erp.db'}"
    database = example("examples/exchange/erp_worker.py", "--server", server.url, "--erp", erp, "--print-database-id").stdout.strip()
    worker = subprocess.Popen([sys.executable, "examples/exchange/erp_worker.py", "--server", server.url, "--erp", erp],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        produced = example("examples/exchange/producer.py", "--server", server.url, "--count", "5", "--database", database)
        assert len(produced.stdout.splitlines()) == 5
        with ExchangeClient(server.url) as client:
            receipts = until(lambda: len((r := client.list("mobile-7", "receipts"))["messages"]) == 5 and r, what="five receipts")
            assert len(receipts["messages"]) == 5
            assert client.list("erp", database)["messages"] == []
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        server.kill()
    import sqlite3

    with sqlite3.connect(tmp_path / "erp.db") as db:
        assert db.execute("select count(*), count(distinct message_id) from orders").fetchone() == (5, 5)

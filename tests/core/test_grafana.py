"""docs/grafana/mainspring.json queries only metrics a server (or a ``mainspring worker --http-port``) exposes
at /metrics.

A name counts as exposed when /metrics has its ``# TYPE`` line — which it has from the moment the metric is
registered, before any series exists — plus the ``_bucket``/``_sum``/``_count`` series of a histogram.

The exchange's and batching's metrics come from ``mainspring.exchange.metrics`` and
``mainspring.batching.metrics``, written on other branches. Until such a module exists, the names the dashboard
expects from it are listed in ``AWAITED``; as soon as the module exists, every one of its names must be exposed,
like any other. So the test holds on this branch and after the merge, and fails when the two disagree.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
from pathlib import Path
from types import SimpleNamespace

import httpx

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "mainspring.json"
METRIC = re.compile(r"\bmainspring_[a-z0-9_]+\b")
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")

AWAITED = {
    "mainspring.exchange.metrics": {
        "mainspring_exchange_processes",  # gauge {state}
        "mainspring_exchange_messages_waiting",  # gauge {mailbox}: "<addressee>/<database>"
    },
    "mainspring.batching.metrics": {
        "mainspring_batching_tasks",  # gauge {batcher, status}
        "mainspring_batching_packages",  # gauge {batcher, status}
        "mainspring_batching_package_claims_total",  # counter {batcher}
        "mainspring_batching_lease_expiries_total",  # counter {batcher}
    },
}


def dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    return {name for expr in exprs for name in METRIC.findall(expr)}


async def exposed_metrics(client: httpx.AsyncClient) -> set[str]:
    text = (await client.get("/metrics")).text
    return names_in(text)


async def worker_metrics() -> set[str]:
    """What a ``mainspring worker``'s own /metrics exposes (its handlers in flight)."""
    from mainspring.app import App
    from mainspring.worker import health_app

    idle = SimpleNamespace(id="w", runners={})
    transport = httpx.ASGITransport(app=health_app(idle, App(), asyncio.Event()))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://worker.test") as worker:
        return names_in((await worker.get("/metrics")).text)


def names_in(text: str) -> set[str]:
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names.add(name)
        if kind == "histogram":
            names.update(name + suffix for suffix in HISTOGRAM_SERIES)
    return names


def still_awaited() -> set[str]:
    """The awaited names of modules that do not exist yet on this branch."""
    return {name for module, names in AWAITED.items() if importlib.util.find_spec(module) is None for name in names}


async def test_every_metric_the_dashboard_queries_is_exposed_by_a_server(client: httpx.AsyncClient) -> None:
    missing = dashboard_metrics() - await exposed_metrics(client) - await worker_metrics() - still_awaited()
    assert missing == set(), f"the dashboard queries metrics no server exposes: {sorted(missing)}"


def test_the_awaited_names_are_all_on_the_dashboard() -> None:
    used = dashboard_metrics()
    unused = {name for names in AWAITED.values() for name in names} - used
    assert unused == set(), f"awaited but not on the dashboard (drop them from AWAITED): {sorted(unused)}"


def test_the_dashboard_asks_for_its_prometheus_data_source() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    [variable] = dashboard["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == ("datasource", "datasource", "prometheus")
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]), panel["title"]

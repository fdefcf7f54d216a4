"""Issue 23's layer decision: the same create (real service, real store) behind each candidate HTTP layer.

    .venv/bin/python -m bench.http_layer_ab [--engine postgres|sqlite] [--seconds 5] [--rounds 2] [--only a,b]

Every variant serves all of the server's /v1 paths (the others answer a stub, so route matching costs what it
costs in the real app), authenticates the caller from the token cache, checks the queue scope, validates the
body into ``CreateIn``, calls ``interactions.service.create`` on one store, keeps request ids and request
metrics, and answers the interaction as JSON. What differs is the layer around it:

- ``fastapi``       — main's server as it is (``mainspring.api.create_app``), for reference.
- ``fastapi-lean``  — (a) FastAPI kept, its per-request work bypassed on the create route: no dependencies,
                      auth and scope in the route, the body validated by the compiled validator, the answer
                      encoded once; one middleware instead of five.
- ``litestar``      — (b) Litestar 2 with a msgspec body, same work.
- ``starlette``     — (b) Starlette's own Router (the core FastAPI stands on) with the route table, one ASGI
                      entry doing request id, body limit, auth, metrics and errors.
- ``own``           — (c) a route table keyed by method and path segments (no linear scan), same entry.

For each it runs ``wrk`` (the shared ``ia_create.lua``) at 1 and 8 connections and prints rps, p50 and the
server process's CPU per request (utime+stime over the requests it answered), the raw floor app beside them.
``--server granian`` serves the variants with granian instead of uvicorn.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

# Route signatures are read by the frameworks from this module's globals (annotations are strings here).
from fastapi import Request as FastAPIRequest
from fastapi import Response as FastAPIResponse

try:
    from litestar import Request as LitestarRequest
    from litestar import Response as LitestarResponse
except ImportError:  # the litestar variant needs `pip install litestar msgspec`
    pass

from bench import ROOT

PROBES = Path(__file__).resolve().parents[2] / "shared" / "bench" / "http"
VARIANTS = ("floor", "fastapi", "fastapi-lean", "litestar", "starlette", "own")


# ---------------------------------------------------------------------------------------------------------
# The apps (built in the server process from the environment)


def _real_paths() -> list[tuple[str, str]]:
    """(method, path) of every /v1 route of main's server."""
    from mainspring.api import create_app
    from mainspring.config import load_settings

    app = create_app(load_settings(None), run_background=False)
    return [(m.upper(), path) for path, ops in app.openapi()["paths"].items() if path.startswith("/v1") for m in ops]


async def _store_and_service() -> Any:
    from mainspring.config import load_settings
    from mainspring.core.auth import Authenticator
    from mainspring.interactions import service
    from mainspring.interactions.models import CreateIn
    from mainspring.store import Store
    from mainspring.store.migrate import migrate

    settings = load_settings(None, server={"database": os.environ["AB_DATABASE"], "data_dir": os.environ["AB_DATA"]})
    store = Store(settings.server.database_url(), pool_size=settings.server.pool_size)
    await migrate(store)
    await store.start()
    auth = Authenticator(store, settings.auth.tokens, settings.auth.cache_ms)
    await auth.is_open()
    return settings, store, auth, service, CreateIn


def build(variant: str) -> Any:
    if variant == "fastapi":
        from mainspring.api import create_app
        from mainspring.config import load_settings
        from mainspring.store import Store
        from mainspring.store.migrate import migrate

        settings = load_settings(None, server={"database": os.environ["AB_DATABASE"], "data_dir": os.environ["AB_DATA"],
                                               "log_level": "WARNING"})

        async def migrated() -> None:
            store = Store(settings.server.database_url())
            await migrate(store)
            await store.close()

        asyncio.run(migrated())
        return create_app(settings)
    return globals()["build_" + variant.replace("-", "_")]()


def _common() -> Any:
    """The work every lean variant shares: request id, metrics, auth + scope, validate, create, encode."""
    from prometheus_client import Counter, Histogram
    from pydantic import ValidationError
    from pydantic_core import to_json

    from mainspring.core.errors import MainspringError

    requests_total = Counter("ab_http_requests_total", "x", ["method", "route", "status"])
    latency = Histogram("ab_http_request_seconds", "x", ["method", "route"])
    state: dict[str, Any] = {}

    async def ensure() -> None:
        if not state:
            settings, store, auth, service, create_in = await _store_and_service()
            state.update(settings=settings, store=store, auth=auth, service=service, CreateIn=create_in)

    async def create(queue: str, body: bytes, authorization: str | None) -> tuple[int, bytes]:
        await ensure()
        started = time.perf_counter()
        try:
            principal = await state["auth"].authenticate(authorization)
            principal.require(f"queues:{queue}")
            model = state["CreateIn"].model_validate_json(body)
            service = state["service"]
            store = state["store"]
            item, created = await service.create(store, state["settings"].interactions, queue, service.spec_from(model, store.now_ms()))
            status, payload = (201 if created else 200), to_json(item)
        except ValidationError as exc:
            status, payload = 422, to_json({"code": "invalid_request", "errors": exc.errors(include_input=False)})
        except MainspringError as exc:
            status, payload = exc.status, to_json(exc.problem())
        requests_total.labels("POST", "/v1/queues/{queue}/interactions", str(status)).inc()
        latency.labels("POST", "/v1/queues/{queue}/interactions").observe(time.perf_counter() - started)
        return status, payload

    return create, ensure


def build_fastapi_lean() -> Any:
    from fastapi import FastAPI
    from fastapi.routing import APIRoute

    create, ensure = _common()
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    class RequestId:
        """A plain ASGI middleware (FastAPI's ``@app.middleware`` would cost far more)."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            rid = uuid.uuid4().hex.encode()

            async def send_with_id(message: Any) -> None:
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", []), (b"x-request-id", rid)]
                await send(message)

            await self.inner(scope, receive, send_with_id)

    app.add_middleware(RequestId)

    async def stub() -> dict[str, str]:
        return {}

    for method, path in _real_paths():
        if path == "/v1/queues/{queue}/interactions" and method == "POST":
            async def create_route(request: FastAPIRequest) -> FastAPIResponse:
                status, payload = await create(request.path_params["queue"], await request.body(), request.headers.get("authorization"))
                return FastAPIResponse(payload, status_code=status, media_type="application/json")

            app.router.routes.append(APIRoute(path, create_route, methods=[method]))
        else:
            app.router.routes.append(APIRoute(path, stub, methods=[method]))
    app.router.on_startup.append(ensure)
    return app


def build_litestar() -> Any:
    import msgspec
    from litestar import Litestar, route
    from litestar.middleware import ASGIMiddleware
    from litestar.openapi import OpenAPIConfig

    create, ensure = _common()

    class RequestId(ASGIMiddleware):
        async def handle(self, scope: Any, receive: Any, send: Any, next_app: Any) -> None:
            rid = uuid.uuid4().hex.encode()

            async def send_with_id(message: Any) -> None:
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", []), (b"x-request-id", rid)]
                await send(message)

            await next_app(scope, receive, send_with_id)

    handlers = []
    for i, (method, path) in enumerate(_real_paths()):
        lpath = re.sub(r"\{(\w+)\}", r"{\1:str}", path)
        if path == "/v1/queues/{queue}/interactions" and method == "POST":
            async def create_route(request: LitestarRequest[Any, Any, Any], queue: str) -> LitestarResponse[bytes]:
                body = await request.body()
                msgspec.json.decode(body)  # the framework's own decode step, as a msgspec-bodied route has
                status, payload = await create(queue, body, request.headers.get("authorization"))
                return LitestarResponse(payload, status_code=status, media_type="application/json")

            handlers.append(route(lpath, http_method=[method], name=f"r{i}")(create_route))
        else:
            async def stub() -> dict[str, str]:
                return {}

            handlers.append(route(lpath, http_method=[method], name=f"r{i}", status_code=200)(stub))
    return Litestar(route_handlers=handlers, middleware=[RequestId()], on_startup=[ensure],
                    openapi_config=OpenAPIConfig(title="x", version="1", path="/schema"), debug=False)


def _entry(find: Any, create: Any, ensure: Any) -> Any:
    """One ASGI entry: request id, body limit, the route, errors — what the lean layer does around a route."""
    headers_json = [(b"content-type", b"application/json")]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await ensure()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        found = find(scope["method"], scope["path"])
        if found is None:
            status, payload = 404, b'{"code":"not_found"}'
        else:
            name, params = found
            body = b""
            more = True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
            authorization = None
            for key, value in scope["headers"]:
                if key == b"authorization":
                    authorization = value.decode("latin-1")
            if name == "create":
                status, payload = await create(params["queue"], body, authorization)
            else:
                status, payload = 200, b"{}"
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers_json, (b"content-length", str(len(payload)).encode()),
                                (b"x-request-id", uuid.uuid4().hex.encode())]})
        await send({"type": "http.response.body", "body": payload})

    return app


def build_starlette() -> Any:
    from starlette.routing import Match, Route, Router

    create, ensure = _common()

    async def endpoint(scope: Any, receive: Any, send: Any) -> None:  # never called: the entry calls the route
        pass

    routes = [Route(path, endpoint, methods=[method], name="create" if path == "/v1/queues/{queue}/interactions" and method == "POST" else f"r{i}")
              for i, (method, path) in enumerate(_real_paths())]
    router = Router(routes=routes)

    def find(method: str, path: str) -> tuple[str, dict[str, str]] | None:
        scope = {"type": "http", "method": method, "path": path, "root_path": ""}
        for candidate in router.routes:
            match, child = candidate.matches(scope)
            if match == Match.FULL:
                return candidate.name, child["path_params"]
        return None

    return _entry(find, create, ensure)


def build_own() -> Any:
    create, ensure = _common()
    table: dict[tuple[str, int], list[tuple[tuple[str | None, ...], tuple[str, ...], str]]] = {}
    for i, (method, path) in enumerate(_real_paths()):
        parts = path.strip("/").split("/")
        literal = tuple(None if p.startswith("{") else p for p in parts)
        names = tuple(p[1:-1] for p in parts if p.startswith("{"))
        name = "create" if path == "/v1/queues/{queue}/interactions" and method == "POST" else f"r{i}"
        table.setdefault((method, len(parts)), []).append((literal, names, name))
    # Literal segments first, so /queues/x/interactions/bulk is not taken by a parameter.
    for entries in table.values():
        entries.sort(key=lambda e: [s is None for s in e[0]])

    def find(method: str, path: str) -> tuple[str, dict[str, str]] | None:
        parts = path.strip("/").split("/")
        for literal, names, name in table.get((method, len(parts)), ()):
            if all(want is None or want == got for want, got in zip(literal, parts, strict=True)):
                values = [got for want, got in zip(literal, parts, strict=True) if want is None]
                return name, dict(zip(names, values, strict=True))
        return None

    return _entry(find, create, ensure)


APP: Any = None
if os.environ.get("AB_VARIANT"):
    APP = build(os.environ["AB_VARIANT"])


# ---------------------------------------------------------------------------------------------------------
# The driver


def _cpu(pid: int) -> float:
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError):
            pass
    return total


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def _wrk(url: str, conns: int, seconds: int) -> tuple[float, float, int]:
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--latency", "-s", str(PROBES / "ia_create.lua"), url],
                         capture_output=True, text=True, env={**os.environ, "QUEUE": "ab"}, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r" 50%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
    p50 = float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if failed:
        raise SystemExit(f"{failed.group(1)} of {total} requests failed:\n{out}")
    return rps, p50, total


def fresh_database(engine: str, tmp: Path, variant: str) -> str:
    if engine == "sqlite":
        return f"sqlite:///{tmp / variant / 'ab.db'}"
    name = f"msbench_ab_{variant.replace('-', '_')}_{os.getpid()}"
    for sql in (f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"'):
        subprocess.run(["psql", "postgresql://postgres@127.0.0.1/postgres", "-q", "-c", sql], check=True, capture_output=True)
    return f"postgresql://postgres@127.0.0.1/{name}"


def run_variant(variant: str, engine: str, seconds: int, port: int, server: str, tmp: Path) -> list[tuple[int, float, float, float]]:
    (tmp / variant).mkdir(exist_ok=True)
    database = fresh_database(engine, tmp, variant)
    env = {**os.environ, "AB_VARIANT": variant, "AB_DATABASE": database, "AB_DATA": str(tmp / variant),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(PROBES)])}
    if variant == "floor":
        target = "floor_app:app"
        env.pop("AB_VARIANT")
    else:
        target = "bench.http_layer_ab:APP"
    if server == "granian":
        command = [sys.executable, "-m", "granian", "--interface", "asgi", "--port", str(port), "--loop", "uvloop",
                   "--log-level", "warning", "--no-ws", target]
    else:
        command = [sys.executable, "-m", "uvicorn", target, "--port", str(port), "--log-level", "warning", "--no-access-log"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=(tmp / f"{variant}.log").open("wb"),
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            if proc.poll() is not None:
                raise SystemExit(f"{variant} exited:\n" + (tmp / f"{variant}.log").read_text()[-3000:])
            try:
                urllib.request.urlopen(urllib.request.Request(url + "/v1/queues/ab/interactions", data=b"{}",
                                                              headers={"Content-Type": "application/json"}), timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        rows = []
        for conns in (1, 8):
            before = _cpu(proc.pid)
            rps, p50, total = _wrk(url, conns, seconds)
            rows.append((conns, rps, p50, (_cpu(proc.pid) - before) / max(total, 1) * 1000))
        return rows
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
        if engine == "postgres":
            subprocess.run(["psql", "postgresql://postgres@127.0.0.1/postgres", "-q", "-c",
                            f'DROP DATABASE IF EXISTS "{database.rsplit("/", 1)[1]}" WITH (FORCE)'], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", default="postgres", choices=["postgres", "sqlite"])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default=",".join(VARIANTS))
    parser.add_argument("--server", default="uvicorn", choices=["uvicorn", "granian"])
    parser.add_argument("--port", type=int, default=18970)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian package wrk)")
    tmp = Path(tempfile.mkdtemp(prefix="msbench-ab-"))
    print(f"engine {args.engine}, server {args.server}, {args.seconds} s per row; load {os.getloadavg()[0]:.1f}")
    print("| variant | round | 1 conn rps · p50 · CPU/req | 8 conns rps · CPU/req |")
    print("| --- | --- | --- | --- |")
    try:
        for round_ in range(1, args.rounds + 1):
            for variant in [v for v in args.only.split(",") if v]:
                rows = run_variant(variant, args.engine, args.seconds, args.port, args.server, tmp)
                one, eight = rows
                print(f"| {variant} | {round_} | {one[1]:,.0f}/s · {one[2]:.2f} ms · {one[3]:.3f} ms "
                      f"| {eight[1]:,.0f}/s · {eight[3]:.3f} ms |", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()

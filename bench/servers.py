"""Many servers on one PostgreSQL, measured: 1, 2, 3 … ``mainspring serve`` processes on one database.

    .venv/bin/pip install -e '.[bench]'   # matplotlib for the plot, py-spy for --profile
    flock /tmp/mainspring-heavy.lock .venv/bin/python -m bench.servers \\
        --pg postgresql://postgres@127.0.0.1:5432/postgres [--servers 1,2,3] [--seconds 10] [--profile]

For each count of servers (a fresh database each time, every server running ``bench/servers_app.py``):
- creates/s: interactions created over HTTP, one ``wrk`` per server (``--connections`` each, so clients grow
  with servers, as they do when a service scales out);
- machine steps/s: Calls on 1,000 counter machines (in-process processor), one ``wrk`` per server;
- processed/s: ``--items`` interactions made due at one instant, handled by every server's in-process
  worker (no-op handler), from that instant until the last is completed.
Each phase also records CPU seconds per party (the servers' process trees, this database's PostgreSQL
backends, wrk, everything else on the machine), so a curve that bends says where the cores went;
``--profile`` adds a py-spy profile of one server during the creates of the largest count.
Results go to ``--out`` (JSON) and the curve to ``--plot`` (PNG).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench import ROOT
from mainspring.interactions import service
from mainspring.interactions.settings import InteractionsSettings
from mainspring.store import Store
from mainspring.store.migrate import migrate

HERE = Path(__file__).resolve().parent
CREATE_QUEUE = "bench-create"
MACHINES = 1000
TICK = os.sysconf("SC_CLK_TCK")

CREATE_LUA = f"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{{"data": {{"n": 1}}}}'
wrk.path = "/v1/queues/{CREATE_QUEUE}/interactions"
"""
CALL_LUA = f"""
request = function()
  local id = "m" .. math.random(1, {MACHINES})
  return wrk.format("POST", "/v1/namespaces/counters/machines/" .. id .. "/call",
    {{["Content-Type"] = "application/json"}}, '{{"args": "inc"}}')
end
"""


@dataclass
class Phase:
    rate: float
    """Operations per second (all servers together)."""
    cpu_s: dict[str, float]
    """CPU seconds per party during the phase: servers, postgres (this database), wrk, rest of the machine."""
    seconds: float
    non_2xx: int = 0


@dataclass
class Run:
    servers: int
    workers: int | None
    creates: Phase
    steps: Phase
    processed: Phase
    profile: dict[str, float] = field(default_factory=dict)
    """Share of one server's samples per area (py-spy, --profile)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_has_workers() -> bool:
    done = subprocess.run([sys.executable, "-m", "mainspring.cli", "serve", "--help"], capture_output=True, text=True, check=False)
    return "--workers" in done.stdout


class Server:
    def __init__(self, database_url: str, data_dir: Path, workers: int | None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "mainspring.cli", "serve", "--port", str(self.port), "--database", database_url,
                "--data-dir", str(data_dir), "--app", "bench.servers_app:app"]
        # --workers: the request-path issue adds `mainspring serve --workers N` (several processes per server);
        # the run is refused before it starts when this serve does not have it (see main()).
        if workers is not None:
            args += ["--workers", str(workers)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               "MAINSPRING_SERVER__LOG_LEVEL": "WARNING"}
        self.log = (data_dir.parent / f"server-{self.port}.log").open("wb")
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server {self.url} not ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


# --- CPU accounting --------------------------------------------------------------------------------------


def _proc_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _tree(pid: int) -> list[int]:
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                pending.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                pass
    return found


def _machine_busy_s() -> float:
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / TICK


class CpuMeter:
    """CPU seconds of the servers' trees, this database's backends and the whole machine, between two reads."""

    def __init__(self, servers: list[Server], pg_admin: str, database: str) -> None:
        self.servers = servers
        self.pg_admin = pg_admin
        self.database = database

    async def _backends(self) -> list[int]:
        conn = await asyncpg.connect(self.pg_admin)
        try:
            return [r[0] for r in await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", self.database)]
        finally:
            await conn.close()

    async def read(self) -> dict[str, Any]:
        server_pids = [p for s in self.servers for p in _tree(s.proc.pid)]
        backends = await self._backends()
        children = os.times()
        return {
            "servers": {p: _proc_cpu_s(p) for p in server_pids},
            "postgres": {p: _proc_cpu_s(p) for p in backends},
            "wrk": children.children_user + children.children_system,
            "machine": _machine_busy_s(),
        }

    @staticmethod
    def spent(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
        def delta(kind: str) -> float:
            return sum(v - before[kind].get(p, 0.0) for p, v in after[kind].items())

        used = {"servers": delta("servers"), "postgres": delta("postgres"), "wrk": after["wrk"] - before["wrk"]}
        used["rest of the machine"] = max(0.0, after["machine"] - before["machine"] - sum(used.values()))
        return {k: round(v, 2) for k, v in used.items()}


# --- phases ----------------------------------------------------------------------------------------------


def _wrk(url: str, script: Path, connections: int, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(["wrk", "-t1", f"-c{connections}", f"-d{seconds:.0f}s", "-s", str(script), url],
                            stdout=subprocess.PIPE, text=True)


def py_spy() -> str | None:
    """py-spy from this interpreter's environment (a venv's bin is often not on PATH), else from PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _py_spy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([py_spy() or "py-spy", "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200", "-f", "raw",
                             "-o", str(out), "--nonblocking", "--subprocesses"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wrk_result(out: str) -> tuple[float, int]:
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return rate, int(non_2xx.group(1)) if non_2xx else 0


async def wrk_phase(servers: list[Server], meter: CpuMeter, script: Path, connections: int, seconds: float,
                    profile_to: Path | None = None) -> Phase:
    before = await meter.read()
    started = time.monotonic()
    runs = [_wrk(s.url, script, connections, seconds) for s in servers]
    spy = None
    if profile_to is not None:
        spy = _py_spy(servers[0].proc.pid, seconds - 1, profile_to)
    outs = [await asyncio.to_thread(r.communicate) for r in runs]
    if spy is not None:
        await asyncio.to_thread(spy.wait)
    elapsed = time.monotonic() - started
    after = await meter.read()
    results = [_wrk_result(out) for out, _ in outs]
    return Phase(rate=round(sum(r for r, _ in results), 1), cpu_s=CpuMeter.spent(before, after),
                 seconds=round(elapsed, 1), non_2xx=sum(n for _, n in results))


async def processing_phase(store: Store, meter: CpuMeter, items: int) -> Phase:
    """``items`` interactions due at one instant; answers completed/s from that instant to the last."""
    cfg = InteractionsSettings()
    due_at = store.now_ms() + 3000 + items // 5
    for start in range(0, items, 1000):
        await service.create_many(store, cfg, "bench-process",
                                  [{"data": {"n": n}, "due_at": due_at} for n in range(start, min(items, start + 1000))])
    await asyncio.sleep(max(0.0, (due_at - store.now_ms()) / 1000 - 0.2))
    before = await meter.read()
    while (await service.get_queue(store, cfg, "bench-process"))["counts"].get("completed", 0) < items:  # noqa: ASYNC110 (polls the store)
        await asyncio.sleep(0.05)
    done_at = store.now_ms()
    after = await meter.read()
    seconds = (done_at - due_at) / 1000
    return Phase(rate=round(items / seconds, 1), cpu_s=CpuMeter.spent(before, after), seconds=round(seconds, 2))


def profile_areas(raw: Path) -> dict[str, float]:
    """py-spy's raw (collapsed) stacks → the share of samples whose innermost frame is in each area."""
    areas: collections.Counter[str] = collections.Counter()
    total = 0
    rules = [("asyncpg", "asyncpg (driver)"), ("sqlalchemy", "SQLAlchemy"), ("pydantic", "pydantic"),
             ("starlette", "Starlette/FastAPI"), ("fastapi", "Starlette/FastAPI"), ("uvicorn", "uvicorn/HTTP"),
             ("httptools", "uvicorn/HTTP"), ("h11", "uvicorn/HTTP"), ("mainspring", "Mainspring"),
             ("asyncio", "asyncio event loop"), ("json", "json"), ("logging", "logging"), ("prometheus", "metrics")]
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        innermost = frames[-1] if frames else ""
        area = next((name for key, name in rules if key in innermost), "other")
        if area in ("asyncio event loop", "other") and any("select" in f or "epoll" in f for f in frames[-2:]):
            area = "idle (waiting in epoll)"
        areas[area] += int(count)
        total += int(count)
    return {k: round(v / total, 3) for k, v in areas.most_common()} if total else {}


async def one_run(count: int, args: argparse.Namespace, tmp: Path) -> Run:
    database = f"msbench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(args.pg)
    await admin.execute(f'CREATE DATABASE "{database}"')
    await admin.close()
    url = args.pg.rsplit("/", 1)[0] + "/" + database
    store = Store(url, pool_size=4)
    servers: list[Server] = []
    try:
        await migrate(store)
        data_dir = tmp / f"data-{count}"
        servers = [Server(url, data_dir, args.workers) for _ in range(count)]
        for server in servers:
            await asyncio.to_thread(server.wait_ready)
        async with httpx.AsyncClient(base_url=servers[0].url, timeout=30) as client:
            await client.put("/v1/namespaces/counters", json={})
            sem = asyncio.Semaphore(16)

            async def start(n: int) -> None:
                async with sem:
                    answer = await client.post("/v1/namespaces/counters/machines", json={"id": f"m{n}", "args": None})
                    assert answer.status_code == 201, answer.text

            await asyncio.gather(*(start(n) for n in range(1, MACHINES + 1)))
        meter = CpuMeter(servers, args.pg, database)
        create_lua, call_lua = tmp / "create.lua", tmp / "call.lua"
        create_lua.write_text(CREATE_LUA)
        call_lua.write_text(CALL_LUA)
        profile_to = tmp / f"profile-{count}.txt" if args.profile and count == max(args.servers) else None
        creates = await wrk_phase(servers, meter, create_lua, args.connections, args.seconds, profile_to)
        steps = await wrk_phase(servers, meter, call_lua, args.connections, args.seconds)
        processed = await processing_phase(store, meter, args.items)
        run = Run(count, args.workers, creates, steps, processed)
        if profile_to is not None and profile_to.exists():
            run.profile = profile_areas(profile_to)
            shutil.copy(profile_to, args.out.with_name(f"servers-profile-{count}.txt"))
        return run
    finally:
        for server in servers:
            server.stop()
        await store.close()
        admin = await asyncpg.connect(args.pg)
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.close()


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [r.servers for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (title, pick) in zip(axes, [("interactions created/s (HTTP)", lambda r: r.creates.rate),
                                        ("machine steps/s (HTTP Call)", lambda r: r.steps.rate),
                                        ("interactions processed/s (in-server workers)", lambda r: r.processed.rate)], strict=True):
        values = [pick(r) for r in runs]
        ax.plot(counts, values, "o-", label="measured")
        ax.plot(counts, [values[0] * c / counts[0] for c in counts], ":", color="grey", label="linear from 1 server")
        for c, v in zip(counts, values, strict=True):
            ax.annotate(f"{v:,.0f}", (c, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("servers on one PostgreSQL")
        ax.set_xticks(counts)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    cores = os.cpu_count()
    fig.suptitle(f"Mainspring servers on one PostgreSQL, one {cores}-core machine ({time.strftime('%Y-%m-%d')})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres", help="an admin URL (databases are created beside it)")
    parser.add_argument("--servers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2, 3])
    parser.add_argument("--seconds", type=float, default=10.0, help="each wrk phase")
    parser.add_argument("--connections", type=int, default=8, help="wrk connections per server")
    parser.add_argument("--items", type=int, default=20_000, help="interactions made due at once for processed/s")
    parser.add_argument("--workers", type=int, default=None, help="processes per server (`mainspring serve --workers`)")
    parser.add_argument("--profile", action="store_true", help="py-spy one server during the largest count's creates")
    parser.add_argument("--out", type=Path, default=HERE / "servers-results.json")
    parser.add_argument("--plot", type=Path, default=HERE / "servers-scaling.png")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    if args.workers is not None and not serve_has_workers():
        sys.exit("this `mainspring serve` has no --workers yet (the request-path issue adds it); run without --workers")
    if args.profile and py_spy() is None:
        sys.exit("--profile needs py-spy (pip install -e '.[bench]')")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="msbench-servers-") as tmp:
        for count in args.servers:
            started = time.monotonic()
            run = asyncio.run(one_run(count, args, Path(tmp)))
            runs.append(run)
            print(f"{count} server(s): creates {run.creates.rate:,.0f}/s, steps {run.steps.rate:,.0f}/s, "
                  f"processed {run.processed.rate:,.0f}/s  ({time.monotonic() - started:.0f} s)", flush=True)
            for name, phase in (("creates", run.creates), ("steps", run.steps), ("processed", run.processed)):
                print(f"    {name:9} cpu s over {phase.seconds} s: {phase.cpu_s}  non-2xx {phase.non_2xx}", flush=True)
            if run.profile:
                print(f"    profile of one server (share of samples): {run.profile}", flush=True)
    load = os.getloadavg()
    args.out.write_text(json.dumps({
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(), "cores": os.cpu_count(),
        "load_average_after": [round(v, 2) for v in load], "connections_per_server": args.connections,
        "seconds": args.seconds, "items": args.items, "runs": [asdict(r) for r in runs],
    }, indent=2))
    plot(runs, args.plot)
    print(f"results: {args.out}\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

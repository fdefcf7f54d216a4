"""What every server of ``bench/servers.py`` runs in-process: a no-op handler for the processing queue and
the counter processor for machine steps (``mainspring serve --app bench.servers_app:app``, the
repository root on PYTHONPATH)."""

from __future__ import annotations

from typing import Any

from mainspring.app import App

PROCESS_QUEUE = "bench-process"
NAMESPACE = "counters"

app = App()


@app.queue(PROCESS_QUEUE, concurrency=1000, batch=500)
async def noop(item: Any) -> None:
    """Completes at once: what is measured is the store's claim/complete path, not a handler."""


@app.processor(NAMESPACE)
class Counter:
    def init(self, args: Any, machine: Any) -> dict[str, Any]:
        return {"events": [{"n": 0}], "aux_state": {"n": 0}}

    def call(self, args: Any, machine: Any) -> dict[str, Any]:
        n = (machine.get("aux_state") or {}).get("n", 0) + 1
        return {"events": [{"n": n}], "aux_state": {"n": n}, "response": n}

    def timeout(self, args: Any, machine: Any) -> dict[str, Any]:
        return {"events": ["tick"]}

    def notification(self, args: Any, machine: Any) -> dict[str, Any]:
        return {"events": [{"note": args}]}

    def repair(self, args: Any, machine: Any) -> dict[str, Any]:
        return {"events": ["repaired"], "response": "ok"}

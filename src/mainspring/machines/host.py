"""Serve a Python processor over HTTP, speaking the processor protocol of API.md §2.

```python
from mainspring.machines.host import serve_processor

class Invoice:
    def init(self, args, machine):
        return {"events": [{"issued": args}], "action": {"timer": {"in_ms": 86_400_000}}}
    def timeout(self, args, machine):
        return {"events": ["overdue"]}

serve_processor(Invoice, port=9000)   # then PUT /v1/namespaces/invoices {"processor": {"url": "http://…:9000/"}}
```
The same class works in-process (``App.processor("invoices")``). Raise ``Unprocessable`` for a permanent
error (answered as ``422 {"code": "unprocessable"}``); any other exception is answered ``500`` (transient).
"""

from __future__ import annotations

import logging

import msgspec
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mainspring.core.runtime import settle_heap
from mainspring.machines.processor import KINDS, LocalProcessor, Unprocessable

log = logging.getLogger("mainspring.machines.host")


def processor_app(target: object, path: str = "/") -> Starlette:
    """An ASGI app answering the processor protocol with ``target`` (a processor class, object or function)."""
    local = LocalProcessor(target)

    async def process(request: Request) -> Response:
        try:
            # msgspec, not ``json``: the request carries the machine's history, decoded on every step.
            body = msgspec.json.decode(await request.body())
        except ValueError:
            return JSONResponse({"code": "invalid_request", "detail": "body is not JSON"}, status_code=400)
        except ClientDisconnect:
            # The server went away mid-request (killed, or gave up): nobody waits for this answer, and the
            # step will be redone by whichever server next takes the machine.
            return JSONResponse({"code": "client_gone"}, status_code=499)
        if not isinstance(body, dict) or body.get("kind") not in KINDS or not isinstance(body.get("machine"), dict):
            return JSONResponse({"code": "invalid_request", "detail": "not a processor request"}, status_code=400)
        try:
            answer = await local.invoke(body["kind"], body.get("args"), body["machine"])
        except Unprocessable as exc:
            return JSONResponse({"code": "unprocessable", "detail": str(exc)}, status_code=422)
        except Exception as exc:
            log.exception("processor failed on %s", body["kind"])
            return JSONResponse({"code": "processor_error", "detail": f"{type(exc).__name__}: {exc}"}, status_code=500)
        return Response(msgspec.json.encode(answer if answer is not None else {"events": []}), media_type="application/json")

    return Starlette(routes=[Route(path, process, methods=["POST"])])


def serve_processor(target: object, host: str = "127.0.0.1", port: int = 9000, path: str = "/") -> None:
    """Run ``target`` as an HTTP processor (blocks; uvicorn), in a process of its own: the heap start-up
    made is settled before serving (``settle_heap``)."""
    import uvicorn

    app = processor_app(target, path)
    settle_heap()
    uvicorn.run(app, host=host, port=port, log_level="warning")

"""No-op processors served over HTTP in a process of their own, for bench/machines.py's `http` and `thrift` rows.

    .venv/bin/python -m bench.machines_processors json PORT     # the JSON protocol (mainspring.machines.host)
    .venv/bin/python -m bench.machines_processors thrift PORT   # Machinegun's Processor service over woody
    .venv/bin/python -m bench.machines_processors raw PORT      # the floor: a bare ASGI app, the same JSON in and out

Each appends one event per step and answers a call with its argument, as a Machinegun user's processor
would at its simplest: what is measured is Mainspring's side of the step, not the business logic.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


class NoOp:
    """The JSON processor: one event per step, the call's argument as its response."""

    async def init(self, args: Any, machine: Any) -> Any:
        return {"events": ["started"]}

    async def call(self, args: Any, machine: Any) -> Any:
        return {"events": [args], "response": args}


def thrift_app() -> Any:
    """Machinegun's ``Processor`` service as a woody server answers it (one event per step), with thriftpy2's
    Cython protocol: a real Machinegun processor (Erlang, Java) does not decode in pure Python either."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
    from thriftpy2.protocol.cybin import TCyBinaryProtocol
    from thriftpy2.thrift import TProcessor
    from thriftpy2.transport.memory import TCyMemoryBuffer

    from mainspring.machines.machinegun import woody
    from mainspring.machines.machinegun.idl import Processor, stateproc

    def change(data: Any) -> Any:
        return stateproc.MachineStateChange(events=[stateproc.Content(data=data)])

    class Handler:
        def ProcessSignal(self, a: Any) -> Any:
            return stateproc.SignalResult(change=change(stateproc.msgpack.Value(str="started")), action=stateproc.ComplexAction())

        def ProcessCall(self, a: Any) -> Any:
            return stateproc.CallResult(response=a.arg, change=change(a.arg), action=stateproc.ComplexAction())

    processor = TProcessor(Processor, Handler())

    async def serve(request: Request) -> Response:
        api, seqid, result, call = processor.process_in(TCyBinaryProtocol(TCyMemoryBuffer(await request.body())))
        result.success = call()
        out = TCyMemoryBuffer()
        processor.send_result(TCyBinaryProtocol(out), api, result, seqid)
        return Response(out.getvalue(), media_type=woody.CONTENT_TYPE)

    return Starlette(routes=[Route("/", serve, methods=["POST"])])


async def raw_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The JSON processor's floor (issue 36: the host within 2× of it): a bare ASGI app under the same uvicorn
    that parses the same request and answers what ``NoOp`` answers, with no framework in between."""
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    request = json.loads(body)
    answer = await getattr(NoOp(), request["kind"])(request.get("args"), request["machine"])
    out = json.dumps(answer).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("json", "thrift", "raw"))
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    kind, port = args.kind, args.port
    if kind == "json":
        from mainspring.machines.host import serve_processor

        serve_processor(NoOp, port=port)
        return
    import uvicorn

    uvicorn.run(raw_app if kind == "raw" else thrift_app(), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()

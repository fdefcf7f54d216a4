"""A Machinegun (woody) client for the tests, built from the project's IDL: what a service written for
Machinegun sends, byte for byte."""

from __future__ import annotations

from typing import Any

import httpx
from thriftpy2.thrift import args_to_kwargs

from mainspring.machines.machinegun import woody
from mainspring.machines.machinegun.idl import Automaton, msgpack, stateproc

PATH = "/v1/machinegun/automaton"
V = msgpack.Value
NIL = V(nl=msgpack.Nil())


def s(text: str) -> Any:
    return V(str=text)


def desc(ns: str, machine_id: str, after: int | None = None, limit: int | None = None, backward: bool = False) -> Any:
    direction = stateproc.Direction.backward if backward else stateproc.Direction.forward
    return stateproc.MachineDescriptor(ns=ns, ref=stateproc.Reference(id=machine_id), range=stateproc.HistoryRange(after=after, limit=limit, direction=direction))


class AutomatonClient:
    """``await mg.Call(desc, args)`` → the result, the IDL's exception raised, or ``woody.WoodyError``."""

    def __init__(self, http: httpx.AsyncClient, url: str = PATH, now_ms: Any = None, deadline_ms: int = 30_000,
                 headers: dict[str, str] | None = None, service: Any = Automaton) -> None:
        self.service = service
        self.http = http
        self.url = url
        self.now_ms = now_ms
        self.deadline_ms = deadline_ms
        self.headers = headers or {}
        self.trace = woody.root_trace()

    def __getattr__(self, api: str) -> Any:
        if api not in self.service.thrift_services:
            raise AttributeError(api)

        async def invoke(*args: Any) -> Any:
            kwargs = args_to_kwargs(getattr(self.service, api + "_args").thrift_spec, *args)
            headers = None if self.now_ms is None else {woody.DEADLINE: woody.format_deadline(self.now_ms() + self.deadline_ms)}
            request_headers = {"content-type": woody.CONTENT_TYPE, **self.trace.child().headers(), **(headers or {}), **self.headers}
            reply = await self.http.post(self.url, content=woody.encode_call(self.service, api, kwargs), headers=request_headers)
            self.last = reply
            if reply.status_code != 200:
                raise woody.WoodyError(reply.status_code, reply.headers.get(woody.ERROR_CLASS, ""), reply.headers.get(woody.ERROR_REASON, ""))
            return woody.decode_reply(self.service, api, reply.content)

        return invoke


def woody_erlang_headers(meta: dict[str, str] | None = None) -> dict[str, str]:
    """What woody_erlang's client sends besides the trace ids and deadline: ``accept``, its ``woody.meta.*``
    (``user-identity.id`` and the like) and no ``Authorization``."""
    return {"accept": woody.CONTENT_TYPE, **{f"woody.meta.{k}": v for k, v in (meta or {}).items()}}


class Unavailable(Exception):
    """Raised by a test processor: answered 503 Resource Unavailable (woody's "nothing happened")."""


def woody_processor_app(handler: Any, service: Any = None) -> Any:
    """A processor written for Machinegun, as woody serves it: ``handler`` has ProcessSignal, ProcessCall
    and ProcessRepair (sync). An exception it declares is 200 Business Error, ``Unavailable`` 503, any
    other 500 Result Unexpected."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
    from thriftpy2.protocol.binary import TBinaryProtocol
    from thriftpy2.thrift import TProcessor
    from thriftpy2.transport.memory import TMemoryBuffer

    from mainspring.machines.machinegun.idl import Processor

    async def serve(request: Request) -> Response:
        handler.requests.append(dict(request.headers))
        processor = TProcessor(service or Processor, handler)
        api, seqid, result, call = processor.process_in(TBinaryProtocol(TMemoryBuffer(await request.body())))
        out = TMemoryBuffer()
        headers = {}
        try:
            result.success = call()
        except Unavailable as exc:
            return Response(status_code=503, headers=woody.error_headers(woody.RESOURCE_UNAVAILABLE, str(exc)))
        except Exception as exc:
            if not processor.handle_exception(exc, result):
                return Response(status_code=500, headers=woody.error_headers(woody.RESULT_UNEXPECTED, repr(exc)))
            headers = woody.error_headers(woody.BUSINESS, type(exc).__name__)
        processor.send_result(TBinaryProtocol(out), api, result, seqid)
        return Response(out.getvalue(), media_type=woody.CONTENT_TYPE, headers=headers)

    return Starlette(routes=[Route("/", serve, methods=["POST"])])

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

    def __init__(self, http: httpx.AsyncClient, url: str = PATH, now_ms: Any = None) -> None:
        self.http = http
        self.url = url
        self.now_ms = now_ms
        self.trace = woody.root_trace()

    def __getattr__(self, api: str) -> Any:
        if api not in Automaton.thrift_services:
            raise AttributeError(api)

        async def invoke(*args: Any) -> Any:
            kwargs = args_to_kwargs(getattr(Automaton, api + "_args").thrift_spec, *args)
            headers = None if self.now_ms is None else {woody.DEADLINE: woody.format_deadline(self.now_ms() + 30_000)}
            request_headers = {"content-type": woody.CONTENT_TYPE, **self.trace.child().headers(), **(headers or {})}
            reply = await self.http.post(self.url, content=woody.encode_call(Automaton, api, kwargs), headers=request_headers)
            self.last = reply
            if reply.status_code != 200:
                raise woody.WoodyError(reply.status_code, reply.headers.get(woody.ERROR_CLASS, ""), reply.headers.get(woody.ERROR_REASON, ""))
            return woody.decode_reply(Automaton, api, reply.content)

        return invoke

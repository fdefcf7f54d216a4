"""Machinegun's event Modernizer: ``Automaton.Modernize`` rewrites a machine's outdated events through the
namespace's ``Modernizer.ModernizeEvent`` (``namespaces.<ns>.modernizer``), as Machinegun does.

An event is outdated when it has no format version or one below ``current_format_version``. What the
Modernizer answers replaces the event when the event had no version or the answer's is higher; an answer
with the same version is left unwritten (a Modernizer that does not know the shape yet hands it back); a
lower version, or none for a versioned event, breaks the protocol and fails the call.
"""

from __future__ import annotations

import functools
from typing import Any

from mainspring.core.runtime import Context
from mainspring.machines import errors, namespaces, service
from mainspring.machines.machinegun import codec, woody
from mainspring.machines.machinegun.idl import stateproc
from mainspring.machines.machinegun.processor import caller_context, failure_of
from mainspring.machines.processor import Origin, ProcessorError, Step
from mainspring.machines.settings import HistoryRange


class BadModernization(ValueError):
    """The Modernizer answered an older version (or none) for a versioned event."""


async def modernize_machine(ctx: Context, namespace: str, machine_id: str, rng: HistoryRange, origin: Origin) -> int:
    """Modernize the outdated events of the machine in ``rng``; how many were rewritten. NamespaceNotFound
    when the namespace has no Modernizer; a Modernizer that fails is a ``ProcessorError``."""
    found = await service.storage_retries(ctx, namespace, origin).run(ctx, functools.partial(namespaces.get_namespace, ctx, namespace))
    config = found.config.modernizer
    if config is None:
        raise errors.NamespaceNotFound(f"namespace {namespace!r} has no modernizer")
    machine = await service.get_machine(ctx, namespace, machine_id, rng, origin=origin)
    rewritten = 0
    for event in machine["history"]:
        version, value = codec.split_content(event["data"])
        if version is not None and version >= config.current_format_version:
            continue
        payload = await _modernized(ctx, config.url, config.timeout_ms, origin, stateproc.MachineEvent(
            ns=namespace, id=machine_id,
            event=stateproc.Event(id=event["id"], created_at=event["created_at"], format_version=version, data=codec.value_from_json(value)),
        ))
        new_version = payload.format_version
        if version is not None and new_version == version:
            continue
        if version is not None and (new_version is None or new_version < version):
            raise BadModernization(f"the modernizer answered format version {new_version} for event {event['id']} of version {version}")
        if await service.rewrite_event(ctx, namespace, machine_id, event["id"], codec.content_to_json(payload), origin):
            rewritten += 1
    return rewritten


async def _modernized(ctx: Context, url: str, timeout_ms: int, origin: Origin, event: Any) -> Any:
    left = timeout_ms if origin.deadline_ms is None else min(timeout_ms, origin.deadline_ms - ctx.now_ms())
    if left <= 0:
        raise errors.DeadlineReached("the caller's woody.deadline passed")
    trace, headers = caller_context(Step(HistoryRange(), origin=origin))
    try:
        result = await woody.call(namespaces.http_transport(ctx), url, stateproc.Modernizer, "ModernizeEvent", {"ev": event},
                                  trace=trace, timeout_ms=left, now_ms=ctx.now_ms(), headers=headers)
    except woody.WoodyError as exc:
        raise failure_of(exc) from exc
    except ProcessorError:
        raise
    except Exception as exc:
        raise ProcessorError(f"the modernizer's answer is not a ModernizeEvent reply: {type(exc).__name__}: {exc}", permanent=True) from exc
    if result is None or result.event_payload is None:
        raise ProcessorError("the modernizer answered no event_payload", permanent=True)
    return result.event_payload

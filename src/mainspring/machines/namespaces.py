"""Namespaces: stored in the store and read on every step, so a change applies on every server at once."""

from __future__ import annotations

from dataclasses import dataclass

from mainspring.core.runtime import Context
from mainspring.machines import data
from mainspring.machines.data import NamespaceRow
from mainspring.machines.errors import NamespaceNotFound, ProcessorFailed
from mainspring.machines.processor import HttpProcessor, HttpTransport, LocalProcessor, Processor
from mainspring.machines.settings import (
    HistoryRange,
    ModernizerConfig,
    NamespaceConfig,
    ProcessorConfig,
    RetryPolicies,
    RetryPolicy,
)
from mainspring.store import Transaction, format_time
from mainspring.store.dialect import Executor

HTTP_CLIENT = "machines:http-client"
LOCAL_PROCESSORS = "machines:local-processors"


@dataclass(frozen=True)
class Namespace:
    name: str
    config: NamespaceConfig
    stored: bool
    updated_at: int | None = None

    @property
    def timeout_ms(self) -> int:
        return self.config.processor.timeout_ms

    @property
    def retry(self) -> RetryPolicy:
        return self.config.retry

    def to_api(self, ctx: Context) -> dict[str, object]:
        return {
            "name": self.name,
            **self.config.model_dump(),
            "in_process": self.config.processor.url is None and local_target(ctx, self.name) is not None,
            "updated_at": format_time(self.updated_at),
        }


def local_target(ctx: Context, name: str) -> object:
    registry = ctx.registry
    registration = getattr(registry, "processors", {}).get(name) if registry is not None else None
    return registration.target if registration is not None else None


_PARSED: dict[tuple[object, ...], Namespace] = {}
"""Namespaces as parsed from their rows: a step reads the row every time (a PUT applies at once on every
server), but validating it into settings models costs more than the read, so a row seen before is not
parsed again."""


_UNSTORED: dict[str, Namespace] = {}
"""In-process namespaces that are not stored, with the defaults (one per registered processor name)."""


def _from_row(row: NamespaceRow) -> Namespace:
    key = (row.name, row.updated_at, row.processor_url, row.timeout_ms, repr(row.retry), repr(row.history), row.processor_protocol, repr(row.retries),
           repr(row.modernizer))
    found = _PARSED.get(key)
    if found is None:
        if len(_PARSED) > 1000:
            _PARSED.clear()
        config = NamespaceConfig(
            processor=ProcessorConfig(url=row.processor_url, timeout_ms=row.timeout_ms, protocol=row.processor_protocol or "json"),
            retry=RetryPolicy.model_validate(row.retry),
            history=HistoryRange.model_validate(row.history),
            retries=RetryPolicies.model_validate(row.retries or {}),
            modernizer=None if row.modernizer is None else ModernizerConfig.model_validate(row.modernizer),
        )
        found = _PARSED[key] = Namespace(row.name, config, stored=True, updated_at=row.updated_at)
    return found


async def find_namespace(conn: Executor, ctx: Context, name: str) -> Namespace:
    """The namespace as stored now; one bound only to an in-process processor has the defaults."""
    return namespace_of(ctx, name, await data.get_namespace(conn, name))


def namespace_of(ctx: Context, name: str, row: NamespaceRow | None) -> Namespace:
    """The namespace ``name`` given its stored row (None: not stored)."""
    if row is not None:
        return _from_row(row)
    if local_target(ctx, name) is not None:
        # Built once per name, as a stored row is parsed once: a step asks for it every time.
        found = _UNSTORED.get(name)
        if found is None:
            found = _UNSTORED[name] = Namespace(name, NamespaceConfig(), stored=False)
        return found
    raise NamespaceNotFound(f"no namespace {name!r}")


async def get_namespace(ctx: Context, name: str) -> Namespace:
    async with ctx.store.read() as conn:
        return await find_namespace(conn, ctx, name)


async def put_namespace(ctx: Context, name: str, config: NamespaceConfig) -> Namespace:
    """Create or replace a namespace; every server uses it from its next step on."""
    async with ctx.store.transaction() as tx:
        row = await save_namespace(tx, name, config)
    return _from_row(row)


async def save_namespace(tx: Transaction, name: str, config: NamespaceConfig) -> NamespaceRow:
    values = {
        "processor_url": config.processor.url,
        "timeout_ms": config.processor.timeout_ms,
        "retry": config.retry.model_dump(),
        "history": config.history.model_dump(),
        "updated_at": tx.store.now_ms(),
        "processor_protocol": config.processor.protocol,
        "retries": config.retries.model_dump(exclude_none=True),
        "modernizer": None if config.modernizer is None else config.modernizer.model_dump(),
    }
    return await data.save_namespace(tx, name, values)


def machinegun_processor(url: str, client: HttpTransport) -> Processor:
    """A processor speaking Machinegun's Thrift ``Processor`` service (needs the ``machinegun`` extra)."""
    try:
        from mainspring.machines.machinegun.processor import MachinegunProcessor
    except ImportError as exc:  # a transient failure: installing the extra and restarting heals it
        raise ProcessorFailed("processor.protocol is machinegun but thriftpy2 is not installed (pip install 'mainspring[machinegun]')") from exc
    return MachinegunProcessor(url, client)


async def close_processors(ctx: Context) -> None:
    """Close this server's connections to its remote processors (opened again by the next call)."""
    transport = ctx.extras.pop(HTTP_CLIENT, None)
    if transport is not None:
        await transport.aclose()


def http_transport(ctx: Context) -> HttpTransport:
    """This server's connection pool to remote processors (and Modernizers)."""
    client = ctx.extras.get(HTTP_CLIENT)
    if client is None:
        client = ctx.extras[HTTP_CLIENT] = HttpTransport(connections=ctx.settings.machines.concurrency * 4)
    return client  # type: ignore[no-any-return]


def processor_for(ctx: Context, namespace: Namespace) -> Processor:
    """The processor that serves ``namespace`` on this server."""
    url = namespace.config.processor.url
    if url is not None:
        client = http_transport(ctx)
        if namespace.config.processor.protocol == "machinegun":
            return machinegun_processor(url, client)
        return HttpProcessor(url, client)
    cache: dict[str, LocalProcessor] = ctx.extras.setdefault(LOCAL_PROCESSORS, {})
    if namespace.name not in cache:
        target = local_target(ctx, namespace.name)
        if target is None:
            # Nothing was tried, so nothing failed: for this server the namespace does not exist (API.md's
            # 404 for Start). Another server, with the in-process processor, serves it.
            raise NamespaceNotFound(f"namespace {namespace.name!r} has no processor on this server "
                                    "(no processor URL, no in-process processor registered here)")
        cache[namespace.name] = LocalProcessor(target)
    return cache[namespace.name]


"""Database URLs as users write them → what SQLAlchemy's async drivers and raw asyncpg connections take.

A highly available PostgreSQL is reached through a libpq-style multi-host URL,
``postgresql://user@h1:5432,h2:5432/db?target_session_attrs=read-write``: each connection tries the hosts in
order and keeps the first that accepts writes, so after a failover new connections find the new primary by
themselves. SQLAlchemy's URL parser takes one host only; its asyncpg dialect spells the list as repeated
``host=h:port`` query arguments instead. Raw asyncpg connections (the LISTEN connection) take the libpq form.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode, urlsplit

from sqlalchemy.engine import URL, make_url

DEFAULT_PG_PORT = 5432


def normalize_url(url: str) -> str:
    """``sqlite:///x.db`` and ``postgresql://…`` (one host or several) → the async drivers' URLs."""
    url = _multi_host_as_query(url)
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return str(parsed.set(drivername="sqlite+pysqlite"))
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://…")


def plain_dsn(url: str, application_name: str | None = None) -> str:
    """A libpq-style DSN for raw asyncpg connections, multi-host when ``url`` names several hosts.

    ``application_name`` shows in ``pg_stat_activity`` (which connection is whose)."""
    parsed = make_url(_multi_host_as_query(url)).set(drivername="postgresql")
    if application_name is not None:
        parsed = parsed.update_query_dict({"application_name": application_name})
    hosts = _query_hosts(parsed)
    if not hosts:
        return parsed.render_as_string(hide_password=False)
    query = {k: v for k, v in parsed.query.items() if k != "host"}
    userinfo = ""
    if parsed.username is not None:
        userinfo = quote(parsed.username, safe="")
        if parsed.password is not None:
            userinfo += ":" + quote(str(parsed.password), safe="")
        userinfo += "@"
    database = quote(parsed.database or "", safe="")
    tail = "?" + urlencode(query, doseq=True) if query else ""
    return f"postgresql://{userinfo}{','.join(hosts)}/{database}{tail}"


def hosts_of(url: str) -> list[str]:
    """The ``host:port`` entries ``url`` connects to, in the order they are tried."""
    parsed = make_url(_multi_host_as_query(url))
    hosts = _query_hosts(parsed)
    if hosts:
        return hosts
    if parsed.host is None:
        return []
    return [f"{parsed.host}:{parsed.port or DEFAULT_PG_PORT}"]


def _query_hosts(parsed: URL) -> list[str]:
    value = parsed.query.get("host")
    if value is None:
        return []
    hosts = [value] if isinstance(value, str) else list(value)
    # A single ``host=/run/postgresql`` is a socket directory, not a host list.
    return hosts if len(hosts) > 1 or (":" in hosts[0] and not hosts[0].startswith("/")) else []


def _multi_host_as_query(url: str) -> str:
    """``scheme://user@h1:p1,h2:p2/db?x=y`` → ``scheme://user@/db?host=h1:p1&host=h2:p2&x=y``; any other URL
    unchanged."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    if "," not in hostlist:
        return url
    hosts = [_with_port(h) for h in hostlist.split(",")]
    query = urlencode([("host", h) for h in hosts]) + ("&" + parts.query if parts.query else "")
    netloc = f"{userinfo}@" if userinfo else ""
    return f"{parts.scheme}://{netloc}{parts.path or '/'}?{query}"


def _with_port(host: str) -> str:
    if not host:
        raise ValueError("empty host in a multi-host database URL")
    if host.startswith("["):  # [IPv6] or [IPv6]:port
        return host if "]:" in host else f"{host}:{DEFAULT_PG_PORT}"
    return host if ":" in host else f"{host}:{DEFAULT_PG_PORT}"

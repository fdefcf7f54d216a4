"""The core's settings sections. The whole file is composed in ``mainspring.config``."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class ServerSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    data_dir: Path = Path("./mainspring-data")
    database: str | None = None
    """``sqlite:///…`` or ``postgresql://…``; default ``sqlite:///<data_dir>/mainspring.db``."""
    pool_size: int = Field(10, ge=1, le=200)
    sqlite_synchronous: str = Field("FULL", pattern="^(OFF|NORMAL|FULL|EXTRA)$")
    poll_interval_ms: int = Field(1000, ge=10)
    """Backstop for wake-ups: no background loop sleeps longer than this."""
    max_json_bytes: int = Field(1 << 20, ge=1024)
    """Largest JSON request body; exchange message bodies have their own limit."""
    max_wait_ms: int = Field(60_000, ge=0)
    """Cap on every long poll (``wait_ms``) a client asks for."""
    graceful_shutdown_ms: int = Field(10_000, ge=0)
    startup_wait_ms: int = Field(60_000, ge=0)
    """How long a starting server or command waits for an unreachable store (a database still starting or
    restarting) before it gives up."""
    rate_limit: str | None = None
    """Requests per client (token, or address when open), e.g. ``"200/second"``; over it: ``429 rate_limited``."""
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    """Serve HTTPS with this certificate and key (PEM)."""
    log_format: str = Field("text", pattern="^(text|json)$")
    log_level: str = "INFO"
    events_retention_ms: int | None = Field(None, ge=1000)

    def database_url(self) -> str:
        return self.database or f"sqlite:///{(self.data_dir / 'mainspring.db').resolve()}"


class TokenConfig(BaseModel):
    token_sha256: str = Field(pattern="^[0-9a-f]{64}$")
    scopes: list[str]
    name: str = "config"


class AuthSettings(BaseModel):
    tokens: list[TokenConfig] = []
    cache_ms: int = Field(2000, ge=0)
    """How long a server trusts its copy of the stored tokens (a revoke reaches every server within this)."""


class NatsSink(BaseModel):
    url: str = "nats://127.0.0.1:4222"
    stream: str = "MAINSPRING"
    subject_prefix: str = "mainspring"


class KafkaSink(BaseModel):
    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str = "mainspring-events"


class WebhookSink(BaseModel):
    url: str
    secret: str | None = None


class EventsSettings(BaseModel):
    """Publishers that copy the outbox elsewhere, each with its own durable cursor."""

    nats: NatsSink | None = None
    kafka: KafkaSink | None = None
    webhooks: list[WebhookSink] = []
    types: list[str] = []
    """Only these event types are published (``prefix*`` allowed); empty means all."""

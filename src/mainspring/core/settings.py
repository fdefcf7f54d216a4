"""The core's settings sections. The whole file is composed in ``mainspring.config``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ServerSettings(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Listen address."""
    port: int = Field(8080, ge=0, le=65535)
    """Listen port."""
    data_dir: Path = Path("./mainspring-data")
    """The SQLite file (by default) and the exchange's message files."""
    database: str | None = None
    """``sqlite:///…`` or ``postgresql://…`` (many servers may share one PostgreSQL database; a highly available
    one takes a multi-host URL, see reliability.md); default ``sqlite:///<data_dir>/mainspring.db``."""
    pool_size: int = Field(10, ge=1, le=200)
    """PostgreSQL connections per server (plus as many overflow)."""
    sqlite_synchronous: str = Field("FULL", pattern="^(OFF|NORMAL|FULL|EXTRA)$")
    """``FULL`` survives power loss; ``NORMAL`` survives process crashes only, and is faster."""
    poll_interval_ms: int = Field(1000, ge=10)
    """Backstop for wake-ups: no background loop sleeps longer than this."""
    max_json_bytes: int = Field(1 << 20, ge=1024)
    """Largest JSON request body; exchange message bodies have their own limit."""
    max_head_bytes: int = Field(32 * 1024, ge=1024)
    """Largest request head (request line and headers) the server reads; past it, ``431`` and the connection is
    closed, counted as the bytes arrive."""
    head_timeout_ms: int = Field(10_000, ge=100)
    """A connection that has not sent a whole request head within this is closed (``408``): a client that
    connects and sends nothing, or sends its headers a byte at a time."""
    body_timeout_ms: int = Field(30_000, ge=100)
    """A request body that sends nothing for this long is refused (``408``, connection closed)."""
    keep_alive_ms: int = Field(5000, ge=100)
    """An idle connection between requests is closed after this."""
    max_wait_ms: int = Field(60_000, ge=0)
    """Cap on every long poll (``wait_ms``) a client asks for."""
    graceful_shutdown_ms: int = Field(10_000, ge=0)
    """On SIGTERM, how long in-flight requests, loops and handlers may take to finish."""
    startup_wait_ms: int = Field(60_000, ge=0)
    """How long a starting server or command waits for an unreachable store (a database still starting or
    restarting) before it gives up."""
    rate_limit: str | None = None
    """Requests per client on ``/v1``, e.g. ``"200/second"``; over it: ``429 rate_limited``. A client is its token
    when that is valid (however the header spells ``Bearer``), else its address (unknown tokens included)."""
    allowed_hosts: list[str] = []
    """The names (``Host`` header, without the port) browsers may reach this server by; ``*.example.com``
    matches any subdomain. Unset: an open server (no tokens) answers a browser only when reached as
    ``localhost``, ``127.0.0.1``, ``::1`` or ``server.host`` (a page on another name that resolves here, DNS
    rebinding, is refused 403 ``cross_site_refused``). Set: every request must name one of them."""
    allowed_origins: list[str] = []
    """Other sites (``https://ops.example.com``) whose pages may write to an open server; a page of this
    server's own origin always may, any other is refused 403 ``cross_site_refused``."""
    tls_certfile: Path | None = None
    """Serve HTTPS with this certificate (PEM), together with ``tls_keyfile``."""
    tls_keyfile: Path | None = None
    """The private key (PEM) of ``tls_certfile``."""
    log_format: str = Field("text", pattern="^(text|json)$")
    """``text``, or ``json`` (one object a line)."""
    log_level: str = "INFO"
    """``DEBUG``, ``INFO``, ``WARNING`` or ``ERROR``."""
    tracing: bool = False
    """OpenTelemetry spans for requests, store statements, background steps and handler runs
    (``pip install 'mainspring[otel]'``; exported by the process's tracer provider, else OTLP/HTTP)."""
    access_log: bool = False
    """One line per request (method, path, status) in the server's log."""
    check_answers: bool = False
    """Check every API answer against its documented schema before sending it (no field missing or extra, no
    value of another type) and fail the request when it differs — for tests; it costs time on every request."""
    events_retention_ms: int | None = Field(7 * 86_400_000, ge=1000)
    """Events older than this are deleted once every configured publisher has passed them (null: kept)."""
    retention_interval_ms: int = Field(60_000, ge=10)
    """How often the server prunes what its retention settings let go."""
    alerts_check_interval_ms: int = Field(2000, ge=10)
    """How often the server looks whether the subject of an open alert was fixed (then closes the alert)."""
    require_sync_replica: bool = False
    """Warn at start when a commit the store acknowledges is not yet on a synchronous standby (PostgreSQL with
    synchronous replication), i.e. a 2xx would not survive the loss of the primary's machine."""

    def database_url(self) -> str:
        return self.database or f"sqlite:///{(self.data_dir / 'mainspring.db').resolve()}"


class TokenConfig(BaseModel):
    """A token configured in the file (beside those stored with ``mainspring token create``)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    token_sha256: str = Field(pattern="^[0-9a-f]{64}$")
    """The sha256 (hex) of the token; the token itself is never written down."""
    scopes: list[str]
    """``admin``, ``ui``, ``queues:<queue>``, ``exchange:send:<addressee>``… (a trailing ``*`` matches any rest)."""
    name: str = "config"
    """Who the token is for."""


class AuthSettings(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    tokens: list[TokenConfig] = []
    """Tokens of the config file, beside the stored ones. A server that never had a token (none configured, none
    ever stored) is open to anyone who can reach it."""
    open_when_all_revoked: bool = False
    """Once a token was stored, revoking the last one leaves the server closed: it refuses every request until a
    token is created (``mainspring token create`` opens the store, so it still works). Set this to open such a
    server to everyone again instead, as one that never had a token."""
    cache_ms: int = Field(2000, ge=0)
    """How long a server trusts its copy of the stored tokens (a revoke reaches every server within this)."""


class NatsSink(BaseModel):
    """Publish every event to a NATS JetStream stream."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    url: str = "nats://127.0.0.1:4222"
    """The NATS server."""
    stream: str = "MAINSPRING"
    """The JetStream stream (created if missing)."""
    subject_prefix: str = "mainspring"
    """Events are published as ``<prefix>.<event type>``."""


class KafkaSecurity(BaseModel):
    """How a Kafka producer reaches a secured cluster: TLS and SASL, as aiokafka takes them."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """``SSL`` or ``SASL_SSL`` for TLS (with the files below, or the system's CAs); ``SASL_*`` to log in."""
    ssl_cafile: str | None = None
    """The CA bundle the brokers' certificates are checked against (None: the system's)."""
    ssl_certfile: str | None = None
    """The client certificate, for brokers that require one (mutual TLS)."""
    ssl_keyfile: str | None = None
    """The client certificate's key."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    """The SASL mechanism, with ``SASL_PLAINTEXT`` or ``SASL_SSL``."""
    sasl_plain_username: str | None = None
    """The SASL user."""
    sasl_plain_password: str | None = None
    """The SASL password (keep it in ``MAINSPRING_…`` environment variables rather than the file)."""

    def producer_options(self) -> dict[str, object]:
        """The options of ``AIOKafkaProducer`` these settings make."""
        options: dict[str, object] = {"security_protocol": self.security_protocol}
        if self.security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            options["ssl_context"] = create_ssl_context(cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile)
        if self.security_protocol.startswith("SASL"):
            options |= {"sasl_mechanism": self.sasl_mechanism, "sasl_plain_username": self.sasl_plain_username,
                        "sasl_plain_password": self.sasl_plain_password}
        return options


class KafkaSink(KafkaSecurity):
    """Publish every event to a Kafka topic."""

    bootstrap_servers: str = "127.0.0.1:9092"
    """The Kafka brokers, comma-separated."""
    topic: str = "mainspring-events"
    """The topic; the key of each record is the event's subject."""


class WebhookSink(BaseModel):
    """POST every event to a URL."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    url: str
    """Where event batches are POSTed as ``{"events": [...]}``; any 2xx acknowledges a batch."""
    secret: str | None = None
    """Sign each request: header ``X-Mainspring-Signature: sha256=<HMAC-SHA256 of the body>``."""


class EventsSettings(BaseModel):
    """Publishers that copy the outbox elsewhere, each with its own durable cursor."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    nats: NatsSink | None = None
    """Publish to NATS JetStream."""
    kafka: KafkaSink | None = None
    """Publish to Kafka."""
    webhooks: list[WebhookSink] = []
    """Publish to webhooks."""
    types: list[str] = []
    """Only these event types are published (``prefix*`` allowed); empty means all."""

"""Settings of the machines face (section `[machines]` of the config file, env `MAINSPRING_MACHINES__<KEY>`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mainspring.core.settings import KafkaSecurity


class RetryPolicy(BaseModel):
    """Exponential backoff for timers and notifications whose processor call failed transiently."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    initial_ms: int = Field(100, ge=0, le=86_400_000)
    """The first delay."""
    factor: float = Field(2.0, ge=1.0, le=100.0)
    """Each next delay is the previous one times this."""
    max_ms: int = Field(60_000, ge=0, le=86_400_000)
    """No delay is longer than this."""
    max_attempts: int | None = Field(10, ge=1, le=1_000_000)
    """Processor calls in all (the first one included); None: no limit."""
    max_total_ms: int | None = Field(None, ge=0, le=315_360_000_000)
    """Give up once this long has passed since the first failure; None: no limit."""
    jitter: float = Field(0.0, ge=0.0, le=1.0)
    """Each delay is drawn from ``[d·(1-jitter), d]``, so many machines failing together do not retry together."""


class HistoryRange(BaseModel):
    """Which part of the history a processor is sent (Machinegun's HistoryRange)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    after: int | None = Field(None, ge=0)
    """Events after this event id (None: from the first)."""
    limit: int | None = Field(None, ge=0, le=100_000)
    """At most this many events (None: all; 0: none, as Machinegun allows)."""
    direction: str = Field("forward", pattern="^(forward|backward)$")
    """``forward`` (oldest first) or ``backward`` (newest first)."""


class ProcessorConfig(BaseModel):
    """Where a namespace's processor is."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    url: str | None = Field(None, max_length=2000, pattern=r"^https?://")
    """None: the namespace is served by an in-process processor registered with ``App.processor``."""
    timeout_ms: int = Field(30_000, ge=1, le=3_600_000)
    """How long the server waits for the processor's answer."""
    protocol: Literal["json", "machinegun"] = "json"
    """How the server talks to ``url``: ``json`` (docs/http.md, Machines) or ``machinegun`` (Machinegun's Thrift
    ``Processor`` service over woody, for processors written for Machinegun; docs/machinegun.md)."""


class RetryPolicies(BaseModel):
    """Retry policies per kind of work, as Machinegun configures them; an absent one is today's behaviour."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    timers: RetryPolicy | None = None
    """A timer whose ``timeout`` step failed transiently (None: the namespace's ``retry``)."""
    notifications: RetryPolicy | None = None
    """A notification whose step failed transiently (None: the namespace's ``retry``)."""
    processor: RetryPolicy | None = None
    """Retries of a transient processor failure within one Start, Call or Repair, before it is answered
    502/504 (None: no retry, the caller decides). Bounded by the call's timeout."""
    storage: RetryPolicy | None = None
    """Retries of an unreachable store within one call over Machinegun's protocol (every Automaton method),
    before it is answered 503 (Machinegun's ``storage`` policy; None: ``STORAGE_RETRY``). Bounded by the
    caller's ``woody.deadline`` or else the processor timeout."""


STORAGE_RETRY = RetryPolicy(initial_ms=10, factor=2.0, max_ms=1_000, max_attempts=None, max_total_ms=None)
"""Machinegun's default ``storage`` policy (exponential from 10 ms, no attempt limit): what bounds it is the
call's deadline."""


class ModernizerConfig(BaseModel):
    """Machinegun's event Modernizer of a namespace: ``Modernize`` sends each event older than
    ``current_format_version`` (or without a version) to ``url``'s ``Modernizer.ModernizeEvent`` and keeps
    what it answers."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    current_format_version: int = Field(..., ge=1, le=2**31 - 1)
    """Events below this format version (or with none) are outdated."""
    url: str = Field(..., max_length=2000, pattern=r"^https?://")
    """The Thrift ``Modernizer`` service (woody, like a Machinegun processor)."""
    timeout_ms: int = Field(30_000, ge=1, le=3_600_000)
    """How long one ``ModernizeEvent`` may take."""


class NamespaceConfig(BaseModel):
    """A namespace: its processor, retry policy and history range."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    processor: ProcessorConfig = ProcessorConfig()
    """The processor."""
    retry: RetryPolicy = RetryPolicy()
    """The retry policy of timers and notifications."""
    history: HistoryRange = HistoryRange()
    """The part of the history sent to the processor."""
    retries: RetryPolicies = RetryPolicies()
    """Retry policies per kind (Machinegun's ``retries``); each absent one falls back as it says."""
    modernizer: ModernizerConfig | None = None
    """Machinegun's event Modernizer (None: ``Modernize`` throws NamespaceNotFound, as Machinegun does)."""


class MachinegunSink(KafkaSecurity):
    """Machine events to Kafka as Machinegun's Thrift-binary ``SinkEvent`` records, keyed ``"<ns> <id>"`` and
    partitioned by ``erlang:phash2`` of the key, as Machinegun's; TLS and SASL as the event publishers'."""

    bootstrap_servers: str = "127.0.0.1:9092"
    """The Kafka brokers, comma-separated."""
    topic: str = Field(..., min_length=1, max_length=249)
    """The topic (Machinegun names one per namespace; any name works)."""
    namespaces: list[str] = []
    """The namespaces whose events go to this topic; empty: every namespace."""


class MachinegunSettings(BaseModel):
    """Machinegun's own protocol (Thrift over HTTP, "woody"; docs/machinegun.md)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    automaton_path: str = Field("/v1/machinegun/automaton", pattern=r"^/[A-Za-z0-9._~/-]*$")
    """Where the Thrift ``Automaton`` service is served (``POST``, ``application/x-thrift``)."""
    event_sink_path: str = Field("/v1/machinegun/event_sink", pattern=r"^/[A-Za-z0-9._~/-]*$")
    """Where the Thrift ``EventSink`` service (the polling sink, ``GetHistory``) is served."""
    listen: str | None = Field(None, pattern=r"^.+:[0-9]{1,5}$")
    """``host:port`` of a listener of its own serving ``/v1/automaton`` and ``/v1/event_sink``, Machinegun's
    paths, as Machinegun is deployed (port 8022 on the services' network); None: only the main server's
    paths above. Under ``serve --workers N`` every process serves it (``SO_REUSEPORT``); an address already
    taken fails the start."""
    event_sinks: dict[str, list[str]] = {}
    """Polling event sinks by id (``EventSink.GetHistory``'s ``event_sink_id``) → the namespaces whose
    events they show (empty: every namespace)."""
    sinks: list[MachinegunSink] = []
    """Kafka event sinks in Machinegun's format (``event_sink.thrift``), each with its own durable cursor."""
    auth: Literal["token", "none"] = "token"
    """``token``: a call needs a token with scope ``machines:<ns>`` like the JSON API; ``none``: calls need no
    token, as with Machinegun (woody clients send no ``Authorization``) — only for a listener on the internal
    network where the services that call Machinegun live."""


class MachinesSettings(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    namespaces: dict[str, NamespaceConfig] = {}
    """Namespaces written to the store at start-up (the file wins over a PUT made before the restart)."""
    lease_margin_ms: int = Field(5_000, ge=0)
    """A background step holds its machine for the processor timeout plus this; then another server retakes it."""
    batch: int = Field(200, ge=1, le=10_000)
    """Due machines taken per round of the background loop."""
    concurrency: int = Field(32, ge=1, le=1_000)
    """Background steps run at once per server."""
    timer_lookahead_ms: int = Field(1000, ge=0, le=10_000)
    """Machines due this soon are leased and read ahead, then fired on the due millisecond."""
    conflict_retries: int = Field(5, ge=0, le=100)
    """How often a Call whose step lost the version race to another step is re-run before 409."""
    journal_in_get: int = Field(100, ge=0, le=10_000)
    """Newest failure-journal entries shown in Get."""
    machinegun: MachinegunSettings = MachinegunSettings()
    """Machinegun's Thrift protocol: the Automaton service's path."""

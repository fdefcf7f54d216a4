"""Machinegun's own ``config.yaml``, read as it is: its namespaces (processor, timeouts, retries, event sinks,
modernizer) and its API listener become Mainspring's ``[machines]`` settings; everything else is listed with
why it is ignored, and keys Machinegun does not have are listed as unknown, never dropped silently.

``mainspring machinegun import-config config.yaml`` prints (or writes) the TOML; ``mainspring serve
--machinegun-config config.yaml`` reads it at start. ``${VAR}`` in a string is the environment variable, as
in Machinegun (undefined is an error).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import tomlkit
import yaml

from mainspring.core.errors import MainspringError


class ConfigError(MainspringError):
    """Machinegun's config.yaml cannot be read: not YAML, a bad duration, an undefined ``${VAR}``."""

    status, code, title = 400, "invalid_machinegun_config", "Invalid Machinegun configuration"


INFINITY = 1_000_000
"""``max_retries: infinity`` as Mainspring's ``max_attempts`` (TOML has no null; the most it allows)."""

# Machinegun's top-level keys Mainspring has no use for, and why.
IGNORED_TOP = {
    "service_name": "names the Erlang service; Mainspring's logs and metrics name themselves",
    "dist_node_name": "Erlang distribution: Mainspring servers share the store instead",
    "dist_port": "Erlang distribution: Mainspring servers share the store instead",
    "erlang": "Erlang VM options",
    "opentelemetry": "tracing is server.tracing (OTEL_* variables) in Mainspring",
    "consuela": "the machine registry: Mainspring leases machines in the store",
    "consul": "the machine registry: Mainspring leases machines in the store",
    "cluster": "the machine registry: Mainspring leases machines in the store",
    "process_registry": "the machine registry: Mainspring leases machines in the store",
    "limits": "Erlang VM limits; a Mainspring server is bounded by machines.concurrency and the pool",
    "logging": "Mainspring's logs are server.log_level and server.log_format",
    "snowflake_machine_id": "Machinegun's id generator; Mainspring's ids come from the store",
    "storage": "Riak or memory; Mainspring's store is server.database (PostgreSQL or SQLite)",
    "worker": "Erlang worker processes; Mainspring has none per machine",
    "health_check": "Mainspring serves /healthz and /readyz",
    "metrics": "Mainspring serves /metrics",
}
KNOWN_TOP = {*IGNORED_TOP, "woody_server", "namespaces", "kafka"}

# A namespace's keys Mainspring has no counterpart for, and why.
IGNORED_NS = {
    "timer_processing_timeout": "a timeout step takes processor.timeout_ms, or its SetTimerAction.timeout",
    "reschedule_timeout": "a failed step is rescheduled by the namespace's retry policy",
    "hibernate_timeout": "Erlang process hibernation; Mainspring keeps no process per machine",
    "unload_timeout": "Erlang process unloading; Mainspring keeps no process per machine",
    "shutdown_timeout": "the server's graceful shutdown is server.graceful_shutdown_ms",
    "timers": "timer scanning: due timers are found by an index, with machines.batch and machines.timer_lookahead_ms",
    "overseer": "Mainspring's loop retakes expired leases by itself",
    "notification": "notification scanning: pending notifications are found by an index",
    "event_stash_size": "an Erlang-side cache; history is read from the store",
    "suicide_probability": "a fault-injection knob for Machinegun's tests",
    "worker": "Erlang worker processes; Mainspring has none per machine",
}
KNOWN_NS = {*IGNORED_NS, "processor", "default_processing_timeout", "retries", "event_sinks", "event_sink", "modernizer"}
IGNORED_CONNECTION = "the outbound connection pool is the server's (machines.concurrency)"

UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "W": 604_800_000}
DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d|W)\s*$")
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass
class Imported:
    """What ``config.yaml`` says in Mainspring's terms: the ``[machines]`` table, and what was left out."""

    machines: dict[str, Any]
    ignored: list[tuple[str, str]] = field(default_factory=list)
    """(key, why) of every key Mainspring has no use for."""
    unknown: list[str] = field(default_factory=list)
    """Keys Machinegun does not have either (a typo, or a newer Machinegun)."""

    def report(self) -> list[str]:
        return [f"ignored {key}: {why}" for key, why in self.ignored] + [f"unknown {key}: not a Machinegun setting Mainspring knows" for key in self.unknown]


def read_machinegun_config(path: str | os.PathLike[str], environ: dict[str, str] | None = None) -> Imported:
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as exc:
        raise ConfigError(f"Machinegun config {path} cannot be read: {exc}") from None
    return import_machinegun_config(text, dict(os.environ) if environ is None else environ, str(path))


def import_machinegun_config(text: str, environ: dict[str, str], name: str = "config.yaml") -> Imported:
    """``config.yaml``'s text as Mainspring's ``[machines]`` settings."""
    try:
        config = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"Machinegun config {name} is not valid YAML: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"Machinegun config {name} is not a mapping")
    config = _interpolate(config, environ, name)
    out = Imported({"namespaces": {}, "machinegun": {"auth": "none"}})
    for key in config:
        if key in IGNORED_TOP:
            out.ignored.append((key, IGNORED_TOP[key]))
        elif key not in KNOWN_TOP:
            out.unknown.append(key)
    server = config.get("woody_server") or {}
    if server:
        ip, port = str(server.get("ip", "::")), int(server.get("port", 8022))
        out.machines["machinegun"]["listen"] = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        for key in server:
            if key not in ("ip", "port"):
                out.ignored.append((f"woody_server.{key}", "HTTP keep-alive and shutdown are the server's"))
    kafka_clients = config.get("kafka") or {}
    for client, settings in kafka_clients.items():
        for key in settings or {}:
            if key not in ("endpoints", "ssl", "sasl"):
                out.ignored.append((f"kafka.{client}.{key}", "the Kafka producer is aiokafka's with acks=all, one batch in flight per partition"))
    for ns, ns_config in (config.get("namespaces") or {}).items():
        _namespace(out, str(ns), ns_config or {}, kafka_clients)
    return out


def _namespace(out: Imported, ns: str, config: dict[str, Any], kafka_clients: dict[str, Any]) -> None:
    where = f"namespaces.{ns}"
    result: dict[str, Any] = {}
    for key in config:
        if key in IGNORED_NS:
            out.ignored.append((f"{where}.{key}", IGNORED_NS[key]))
        elif key not in KNOWN_NS:
            out.unknown.append(f"{where}.{key}")
    processor = config.get("processor") or {}
    result["processor"] = {"url": processor.get("url"), "protocol": "machinegun",
                           "timeout_ms": _ms(config.get("default_processing_timeout", "30s"), f"{where}.default_processing_timeout")}
    for key in processor:
        if key != "url":
            out.ignored.append((f"{where}.processor.{key}", IGNORED_CONNECTION))
    retries: dict[str, Any] = {}
    for kind, policy in (config.get("retries") or {}).items():
        if kind == "continuation":
            out.ignored.append((f"{where}.retries.continuation", "a step's writes are one transaction: there is nothing to continue"))
        elif kind in ("storage", "processor", "timers"):
            converted = _policy(out, f"{where}.retries.{kind}", policy or {})
            if converted is not None:
                retries[kind] = converted
        else:
            out.unknown.append(f"{where}.retries.{kind}")
    if retries:
        result["retries"] = retries
    modernizer = config.get("modernizer")
    if modernizer:
        handler = modernizer.get("handler") or {}
        result["modernizer"] = {"current_format_version": int(modernizer["current_format_version"]), "url": handler.get("url")}
        for key in handler:
            if key != "url":
                out.ignored.append((f"{where}.modernizer.handler.{key}", IGNORED_CONNECTION))
    sinks = config.get("event_sinks") or {}
    if "event_sink" in config:  # the older form: one polling sink by its id
        sinks = {**sinks, "machine": {"type": "machine", "machine_id": config["event_sink"]}}
    for sink_name, sink in sinks.items():
        _event_sink(out, ns, f"{where}.event_sinks.{sink_name}", sink or {}, kafka_clients)
    out.machines["namespaces"][ns] = result


def _event_sink(out: Imported, ns: str, where: str, sink: dict[str, Any], kafka_clients: dict[str, Any]) -> None:
    machinegun = out.machines["machinegun"]
    if sink.get("type") == "kafka":
        client = kafka_clients.get(sink.get("client"), {}) or {}
        endpoints = ",".join(f"{e['host']}:{e['port']}" for e in client.get("endpoints", []))
        entry = {"bootstrap_servers": endpoints or "127.0.0.1:9092", "topic": str(sink["topic"]), "namespaces": [ns],
                 **_kafka_security(out, f"kafka.{sink.get('client')}", client)}
        for existing in machinegun.setdefault("sinks", []):
            if (existing["bootstrap_servers"], existing["topic"]) == (entry["bootstrap_servers"], entry["topic"]):
                existing["namespaces"].append(ns)
                return
        machinegun["sinks"].append(entry)
    elif sink.get("type") == "machine":
        machinegun.setdefault("event_sinks", {}).setdefault(str(sink["machine_id"]), []).append(ns)
    else:
        out.unknown.append(f"{where}.type={sink.get('type')}")


SASL_MECHANISMS = {"plain": "PLAIN", "scram_sha_256": "SCRAM-SHA-256", "scram_sha_512": "SCRAM-SHA-512"}
"""brod's SASL mechanisms (Machinegun's Kafka client) by aiokafka's names."""


def _kafka_security(out: Imported, where: str, client: dict[str, Any]) -> dict[str, Any]:
    """A brod client's ``ssl`` (``true``, or its ``cacertfile``/``certfile``/``keyfile``) and ``sasl``
    (``mechanism``, ``username``, ``password``) as a sink's TLS and SASL settings (``KafkaSecurity``)."""
    ssl, sasl = client.get("ssl"), client.get("sasl")
    found: dict[str, Any] = {}
    if isinstance(ssl, dict):
        files = {"cacertfile": "ssl_cafile", "certfile": "ssl_certfile", "keyfile": "ssl_keyfile"}
        found |= {files[k]: str(v) for k, v in ssl.items() if k in files}
        out.ignored += [(f"{where}.ssl.{k}", "TLS takes the CA, the certificate and its key only") for k in ssl if k not in files]
    if isinstance(sasl, dict):
        mechanism = str(sasl.get("mechanism", "plain")).lower()
        if mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"{where}.sasl.mechanism: {mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}")
        found |= {"sasl_mechanism": SASL_MECHANISMS[mechanism], "sasl_plain_username": sasl.get("username"),
                  "sasl_plain_password": sasl.get("password")}
    tls = bool(ssl)
    if sasl:
        found["security_protocol"] = "SASL_SSL" if tls else "SASL_PLAINTEXT"
    elif tls:
        found["security_protocol"] = "SSL"
    return found


def _policy(out: Imported, where: str, policy: dict[str, Any]) -> dict[str, Any] | None:
    """A Machinegun retry policy (genlib_retry's exponential / linear) as Mainspring's RetryPolicy."""
    kind = policy.get("type", "exponential")
    if kind not in ("exponential", "linear"):
        out.ignored.append((where, f"retry type {kind!r} has no counterpart (exponential and linear do): the default applies"))
        return None
    result: dict[str, Any] = {"initial_ms": _ms(policy.get("timeout", "10ms"), f"{where}.timeout")}
    result["factor"] = float(policy.get("factor", 2)) if kind == "exponential" else 1.0
    result["max_ms"] = _ms(policy["max_timeout"], f"{where}.max_timeout") if "max_timeout" in policy else (
        result["initial_ms"] if kind == "linear" else 86_400_000)
    retries = policy.get("max_retries", "infinity")
    if isinstance(retries, dict):
        result["max_attempts"] = INFINITY
        result["max_total_ms"] = _ms(retries.get("max_total_timeout"), f"{where}.max_retries.max_total_timeout")
    elif retries == "infinity":
        result["max_attempts"] = INFINITY
    else:
        result["max_attempts"] = int(retries) + 1  # Machinegun counts the retries; Mainspring the calls
    if "timecap" in policy:
        result["max_total_ms"] = _ms(policy["timecap"], f"{where}.timecap")
    if "jitter" in policy:
        out.ignored.append((f"{where}.jitter", "Machinegun's jitter is milliseconds; Mainspring's retry jitter is a fraction (set it by hand)"))
    return result


def _ms(value: object, where: str) -> int:
    """Machinegun's durations: ``10ms``, ``30s``, ``1m``, ``2h``, ``1d``, ``4W``, or milliseconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    found = DURATION.match(str(value))
    if found is None:
        raise ConfigError(f"Machinegun config: {where} = {value!r} is not a duration (10ms, 30s, 1m, 2h, 1d, 4W)")
    return int(found.group(1)) * UNITS_MS[found.group(2)]


def _interpolate(value: Any, environ: dict[str, str], name: str) -> Any:
    if isinstance(value, str):
        def variable(found: re.Match[str]) -> str:
            if found.group(1) not in environ:
                raise ConfigError(f"Machinegun config {name}: ${{{found.group(1)}}} is not set")
            return environ[found.group(1)]

        return VARIABLE.sub(variable, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, environ, name) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, environ, name) for v in value]
    return value


def to_toml(imported: Imported) -> str:
    """The ``[machines]`` settings as a TOML file for ``mainspring serve --config``, what was left out in
    comments at its top."""
    document = tomlkit.document()
    document.add(tomlkit.comment("Mainspring settings from Machinegun's config.yaml (mainspring machinegun import-config)."))
    for line in imported.report():
        document.add(tomlkit.comment(line))
    document.add(tomlkit.nl())
    document["machines"] = _without_none(imported.machines)
    return tomlkit.dumps(document)


def _without_none(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value

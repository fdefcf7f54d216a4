"""The whole configuration: TOML file, then ``MAINSPRING_<SECTION>__<KEY>`` variables, then flags."""

from __future__ import annotations

import difflib
import importlib
import os
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path

from pydantic import BaseModel, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from mainspring.batching.settings import BatchingSettings
from mainspring.core.errors import MainspringError
from mainspring.core.settings import AuthSettings, EventsSettings, ServerSettings
from mainspring.exchange.settings import ExchangeSettings
from mainspring.interactions.settings import InteractionsSettings
from mainspring.machines.settings import MachinesSettings
from mainspring.workflows.settings import WorkflowsSettings


class ConfigError(MainspringError):
    """The configuration cannot be used: a missing or malformed file, an unknown key, a bad value."""

    status, code, title = 400, "invalid_config", "Invalid configuration"


class Settings(BaseSettings):
    """Every setting, section by section (``docs/configuration.md`` is generated from these models)."""

    model_config = SettingsConfigDict(env_prefix="MAINSPRING_", env_nested_delimiter="__", extra="forbid")

    server: ServerSettings = ServerSettings()
    auth: AuthSettings = AuthSettings()
    events: EventsSettings = EventsSettings()
    exchange: ExchangeSettings = ExchangeSettings()
    machines: MachinesSettings = MachinesSettings()
    interactions: InteractionsSettings = InteractionsSettings()
    batching: BatchingSettings = BatchingSettings()
    workflows: WorkflowsSettings = WorkflowsSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config_file = os.environ.get("MAINSPRING_CONFIG")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)


def read_config_file(path: Path) -> dict[str, object]:
    """The TOML file's tables, checked: it exists, parses, and names only known keys."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    unknown = unknown_keys(data, Settings)
    if unknown:
        raise ConfigError(f"config file {path}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
    return data


def unknown_keys(data: object, model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted names of the keys in ``data`` that ``model`` (and its nested models) does not have."""
    if not isinstance(data, dict):
        return []
    found: list[str] = []
    for key, value in data.items():
        field = model.model_fields.get(key)
        name = f"{prefix}{key}"
        if field is None:
            # As for a mistyped environment variable (unknown_variables): the key it most likely meant.
            meant = difflib.get_close_matches(str(key), list(model.model_fields), n=1, cutoff=0.6)
            found.append(f"{name} (did you mean {prefix}{meant[0]}?)" if meant else name)
            continue
        for nested in _models_in(field.annotation):
            if isinstance(value, list):
                for index, item in enumerate(value):
                    found += unknown_keys(item, nested, f"{name}[{index}].")
            elif isinstance(value, dict) and _is_mapping_of_models(field.annotation):
                for sub, item in value.items():
                    found += unknown_keys(item, nested, f"{name}.{sub}.")
            else:
                found += unknown_keys(value, nested, f"{name}.")
    return found


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, dict):
        args = typing.get_args(annotation)
        if origin is dict:
            args = args[1:]
        return [m for a in args for m in _models_in(a)]
    return []


def _is_mapping_of_models(annotation: object) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_mapping_of_models(a) for a in typing.get_args(annotation))
    return origin is dict


ENV_PREFIX = "MAINSPRING_"
COMMAND_VARIABLES = frozenset({"MAINSPRING_CONFIG", "MAINSPRING_URL", "MAINSPRING_TOKEN", "MAINSPRING_DEBUG",
                               "MAINSPRING_SERVE_SETTINGS", "MAINSPRING_SERVE_APP"})
"""Variables the commands read that are not settings (``MAINSPRING_SERVE_*`` pass ``serve --workers``'s
settings to its processes)."""
TOOL_PREFIXES = ("MAINSPRING_TEST_", "MAINSPRING_BENCH_", "MAINSPRING_CHAOS_", "MAINSPRING_FUZZ_")
"""Variables of the project's own test, chaos and benchmark tools, which start servers in their environment."""


def setting_variables(model: type[BaseModel] = Settings, prefix: str = ENV_PREFIX) -> Iterator[str]:
    """Every ``MAINSPRING_<SECTION>__<KEY>`` variable that names a setting (nested tables too)."""
    for key, field in model.model_fields.items():
        name = f"{prefix}{key.upper()}"
        yield name
        for nested in _models_in(field.annotation):
            if not _is_mapping_of_models(field.annotation) and typing.get_origin(field.annotation) is not list:
                yield from setting_variables(nested, f"{name}__")


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """What is wrong with each ``MAINSPRING_*`` variable of ``environ`` that names no setting (pydantic-settings
    would ignore it silently), with the setting it most likely meant."""
    known = set(setting_variables())
    found = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in COMMAND_VARIABLES or upper.startswith(TOOL_PREFIXES) or upper in known:
            continue
        meant = difflib.get_close_matches(upper, known, n=1, cutoff=0.8)
        found.append(f"{name} names no setting{f' (did you mean {meant[0]}?)' if meant else ''}")
    return found


def check_installed(settings: Settings) -> None:
    """A ``ConfigError`` naming the extra to install when the settings use a publisher or sink whose module is
    missing: at start, not a traceback every second from a background loop while the server says ready."""
    wanted = [("events.kafka", "aiokafka", "kafka")] if settings.events.kafka is not None else []
    wanted += [("events.nats", "nats", "nats")] if settings.events.nats is not None else []
    wanted += [("machines.machinegun.sinks", "aiokafka", "machinegun")] if settings.machines.machinegun.sinks else []
    for what, module, extra in wanted:
        try:
            importlib.import_module(module)
        except ImportError:
            raise ConfigError(f"{what} needs {module}, which is not installed: pip install 'mainspring[{extra}]'") from None


def load_settings(config_file: Path | None = None, **sections: dict[str, object]) -> Settings:
    """Settings from ``config_file`` (or ``$MAINSPRING_CONFIG``), the environment, then ``sections``
    (what flags set, section by section), later ones winning key by key. A config file that does not
    exist, does not parse or names an unknown key is a ``ConfigError``; so is a ``MAINSPRING_*`` variable that
    names no setting (``COMMAND_VARIABLES`` and ``TOOL_PREFIXES`` aside), and a value out of range."""
    unknown = unknown_variables(os.environ)
    if unknown:
        raise ConfigError(f"environment: {'; '.join(unknown)}; settings are MAINSPRING_<SECTION>__<KEY>, "
                          "listed in docs/configuration.md")
    previous = os.environ.get("MAINSPRING_CONFIG")
    named = config_file or (Path(previous) if previous else None)
    if named is not None:
        read_config_file(named)
    if config_file is not None:
        os.environ["MAINSPRING_CONFIG"] = str(config_file)
    try:
        base = Settings()
        if not any(sections.values()):
            return base
        data = base.model_dump()
        for section, values in sections.items():
            data[section] = {**data.get(section, {}), **{k: v for k, v in values.items() if v is not None}}
        return Settings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid settings: {problems}") from None
    finally:
        if config_file is not None:
            if previous is None:
                os.environ.pop("MAINSPRING_CONFIG", None)
            else:
                os.environ["MAINSPRING_CONFIG"] = previous

"""The whole configuration: TOML file, then ``MAINSPRING_<SECTION>__<KEY>`` variables, then flags."""

from __future__ import annotations

import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

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


def read_config_file(path: Path) -> dict[str, Any]:
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


def unknown_keys(data: Any, model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted names of the keys in ``data`` that ``model`` (and its nested models) does not have."""
    if not isinstance(data, dict):
        return []
    found: list[str] = []
    for key, value in data.items():
        field = model.model_fields.get(key)
        name = f"{prefix}{key}"
        if field is None:
            found.append(name)
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


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, dict):
        args = typing.get_args(annotation)
        if origin is dict:
            args = args[1:]
        return [m for a in args for m in _models_in(a)]
    return []


def _is_mapping_of_models(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_mapping_of_models(a) for a in typing.get_args(annotation))
    return origin is dict


def load_settings(config_file: Path | None = None, **sections: dict[str, Any]) -> Settings:
    """Settings from ``config_file`` (or ``$MAINSPRING_CONFIG``), the environment, then ``sections``
    (what flags set, section by section), later ones winning key by key. A config file that does not
    exist, does not parse or names an unknown key is a ``ConfigError``; so is a value out of range."""
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

"""The whole configuration: TOML file, then ``MAINSPRING_<SECTION>__<KEY>`` variables, then flags."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from mainspring.batching.settings import BatchingSettings
from mainspring.core.settings import AuthSettings, EventsSettings, ServerSettings
from mainspring.exchange.settings import ExchangeSettings
from mainspring.interactions.settings import InteractionsSettings
from mainspring.machines.settings import MachinesSettings


class Settings(BaseSettings):
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


def load_settings(config_file: Path | None = None, **sections: dict[str, Any]) -> Settings:
    """Settings from ``config_file`` (or ``$MAINSPRING_CONFIG``), the environment, then ``sections``
    (what flags set, section by section), later ones winning key by key."""
    previous = os.environ.get("MAINSPRING_CONFIG")
    if config_file is not None:
        os.environ["MAINSPRING_CONFIG"] = str(config_file)
    try:
        base = Settings()
    finally:
        if config_file is not None:
            if previous is None:
                os.environ.pop("MAINSPRING_CONFIG", None)
            else:
                os.environ["MAINSPRING_CONFIG"] = previous
    if not any(sections.values()):
        return base
    data = base.model_dump()
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **{k: v for k, v in values.items() if v is not None}}
    return Settings.model_validate(data)

"""Settings from the environment: a ``MAINSPRING_*`` variable that names no setting is an error naming it,
as a mistyped key in the config file is."""

from __future__ import annotations

import pytest

from mainspring.config import ConfigError, load_settings


def test_a_mistyped_settings_variable_is_an_error_that_names_it_and_the_setting_meant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAINSPRING_SERVER__PROT", "18102")
    with pytest.raises(ConfigError, match=r"MAINSPRING_SERVER__PROT names no setting.*MAINSPRING_SERVER__PORT"):
        load_settings(None)


@pytest.mark.parametrize("name", ["MAINSPRING_SERVR__PORT", "MAINSPRING_SERVER_PORT", "mainspring_server__prot",
                                  "MAINSPRING_EVENTS__NATS__URLS", "MAINSPRING_PORT"])
def test_every_mainspring_variable_that_names_no_setting_is_refused(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "1")
    with pytest.raises(ConfigError, match=name):
        load_settings(None)


def test_settings_variables_and_the_commands_own_variables_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"MAINSPRING_SERVER__PORT": "18102", "mainspring_exchange__backup": "true",
                        "MAINSPRING_EVENTS__NATS__URL": "nats://127.0.0.1:4223", "MAINSPRING_AUTH__TOKENS": "[]",
                        "MAINSPRING_URL": "http://127.0.0.1:8080", "MAINSPRING_TOKEN": "t", "MAINSPRING_DEBUG": "1",
                        "MAINSPRING_TEST_ENGINES": "sqlite"}.items():
        monkeypatch.setenv(name, value)
    settings = load_settings(None)
    assert settings.server.port == 18102 and settings.exchange.backup is True
    assert settings.events.nats is not None and settings.events.nats.url == "nats://127.0.0.1:4223"

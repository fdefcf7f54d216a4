"""Machinegun's own config.yaml, read as it is (machinegun/config_import.py): ``mainspring machinegun
import-config`` prints Mainspring's TOML and lists what it leaves out; ``serve --machinegun-config`` reads it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mainspring.cli import cli, with_machinegun_config
from mainspring.config import ConfigError, Settings, load_settings
from mainspring.machines.machinegun.config_import import ConfigError as MachinegunConfigError
from mainspring.machines.machinegun.config_import import import_machinegun_config

CONFIG = Path(__file__).parent / "data" / "machinegun-config.yaml"
ENV = {"FISTFUL_URL": "http://fistful:8022"}


def test_import_config_prints_the_two_namespaces_as_mainspring_toml_and_lists_what_it_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FISTFUL_URL", ENV["FISTFUL_URL"])
    result = CliRunner().invoke(cli, ["machinegun", "import-config", str(CONFIG), "--output", str(tmp_path / "mainspring.toml")])
    assert result.exit_code == 0, result.output
    machines = tomllib.loads((tmp_path / "mainspring.toml").read_text())["machines"]
    invoice, session = machines["namespaces"]["invoice"], machines["namespaces"]["ff/withdrawal/session_v2"]
    assert invoice["processor"] == {"url": "http://hellgate:8022/v1/stateproc/invoice", "protocol": "machinegun", "timeout_ms": 30_000}
    assert session["processor"] == {"url": "http://fistful:8022/v1/stateproc/ff/withdrawal/session_v2", "protocol": "machinegun", "timeout_ms": 5_000}
    assert invoice["retries"]["storage"] == {"initial_ms": 10, "factor": 2.0, "max_ms": 60_000, "max_attempts": 1_000_000}
    assert invoice["retries"]["processor"]["max_total_ms"] == 86_400_000
    assert invoice["retries"]["timers"] == {"initial_ms": 1000, "factor": 2.0, "max_ms": 1_800_000, "max_attempts": 101}
    assert invoice["modernizer"] == {"current_format_version": 2, "url": "http://hellgate:8022/v1/modernizer"}
    assert machines["machinegun"]["listen"] == "[::]:8022" and machines["machinegun"]["auth"] == "none"
    assert machines["machinegun"]["sinks"] == [{"bootstrap_servers": "kafka1:9092,kafka2:9092", "topic": "mg-invoice", "namespaces": ["invoice"]}]
    assert machines["machinegun"]["event_sinks"] == {"payproc": ["invoice", "ff/withdrawal/session_v2"]}

    # What it left out, and why, on stderr and in the file; unknown keys are named, not dropped.
    report = result.stderr
    for key in ("ignored storage:", "ignored erlang:", "ignored namespaces.invoice.timer_processing_timeout:",
                "ignored namespaces.invoice.retries.continuation:", "ignored namespaces.invoice.processor.pool_size:",
                "ignored kafka.default_kafka_client.producer:", "ignored woody_server.http_keep_alive_timeout:",
                "unknown namespaces.ff/withdrawal/session_v2.shiny_new_option"):
        assert key in report, key
        assert f"# {key}" in (tmp_path / "mainspring.toml").read_text()

    # The file is a config Mainspring serves with.
    settings = load_settings(tmp_path / "mainspring.toml")
    assert settings.machines.namespaces["invoice"].retries.storage is not None
    assert settings.machines.machinegun.event_sinks["payproc"] == ["invoice", "ff/withdrawal/session_v2"]


def test_import_config_prints_to_stdout_and_refuses_an_undefined_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FISTFUL_URL", raising=False)
    refused = CliRunner().invoke(cli, ["machinegun", "import-config", str(CONFIG)])
    assert refused.exit_code == 2 and "${FISTFUL_URL} is not set" in refused.stderr
    monkeypatch.setenv("FISTFUL_URL", "http://f")
    printed = CliRunner().invoke(cli, ["machinegun", "import-config", str(CONFIG)])
    assert printed.exit_code == 0 and tomllib.loads(printed.stdout)["machines"]["namespaces"]["invoice"]


@pytest.mark.parametrize("text", ["namespaces: [", "namespaces:\n  a:\n    default_processing_timeout: soon\n"])
def test_a_config_that_is_not_machineguns_is_refused_with_why(text: str) -> None:
    with pytest.raises(MachinegunConfigError):
        import_machinegun_config(text, {})


def test_serve_machinegun_config_adds_its_namespaces_to_the_toml_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FISTFUL_URL", "http://f")
    toml = tmp_path / "mainspring.toml"
    toml.write_text('[machines.namespaces.other]\nprocessor = { url = "http://other/" }\n')
    settings: Settings = with_machinegun_config(load_settings(toml), CONFIG)
    assert set(settings.machines.namespaces) == {"other", "invoice", "ff/withdrawal/session_v2"}
    assert settings.machines.machinegun.listen == "[::]:8022"
    bad = tmp_path / "bad.yaml"
    bad.write_text("namespaces:\n  a:\n    processor:\n      url: ftp://nope\n")
    with pytest.raises(ConfigError):
        with_machinegun_config(load_settings(toml), bad)

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


SECURED = """
kafka:
    secure_client:
        endpoints:
            - host: "kafka1"
              port: 9093
        ssl:
            cacertfile: "/etc/kafka/ca.crt"
            certfile: "/etc/kafka/client.crt"
            keyfile: "/etc/kafka/client.key"
        sasl:
            mechanism: scram_sha_512
            username: "mg"
            password: "secret"
namespaces:
    invoice:
        processor:
            url: http://hellgate:8022/v1/stateproc/invoice
        event_sinks:
            kafka:
                type: kafka
                client: secure_client
                topic: mg-invoice
"""


def test_import_config_keeps_the_kafka_clients_tls_and_sasl_on_its_sinks() -> None:
    imported = import_machinegun_config(SECURED, {})
    [sink] = imported.machines["machinegun"]["sinks"]
    assert sink == {"bootstrap_servers": "kafka1:9093", "topic": "mg-invoice", "namespaces": ["invoice"],
                    "ssl_cafile": "/etc/kafka/ca.crt", "ssl_certfile": "/etc/kafka/client.crt", "ssl_keyfile": "/etc/kafka/client.key",
                    "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "mg", "sasl_plain_password": "secret",
                    "security_protocol": "SASL_SSL"}
    assert not [key for key, _why in imported.ignored if ".ssl" in key or ".sasl" in key]


def test_a_sinks_tls_and_sasl_settings_become_aiokafkas_producer_options(tmp_path: Path) -> None:
    import ssl

    from mainspring.machines.settings import MachinegunSink

    plain = MachinegunSink(topic="t").producer_options()
    assert plain == {"security_protocol": "PLAINTEXT"}
    secured = MachinegunSink(topic="t", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="mg",
                             sasl_plain_password="secret").producer_options()
    assert isinstance(secured.pop("ssl_context"), ssl.SSLContext)
    assert secured == {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "mg",
                       "sasl_plain_password": "secret"}


def test_serve_with_a_sink_whose_module_is_missing_stops_at_start_naming_the_extra(tmp_path: Path) -> None:
    from tests.conftest import free_port
    from tests.test_cli import mainspring, one_line_error

    hidden = tmp_path / "hide"
    (hidden / "aiokafka").mkdir(parents=True)
    (hidden / "aiokafka" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'aiokafka'\", name='aiokafka')\n")
    config = tmp_path / "mainspring.toml"
    config.write_text('[[machines.machinegun.sinks]]\ntopic = "mg-invoice"\n')
    done = mainspring("serve", "--config", str(config), "--port", str(free_port()), "--data-dir", str(tmp_path / "data"),
                      env={"PYTHONPATH": str(hidden)})
    one_line_error(done, 2, "machines.machinegun.sinks needs aiokafka", "pip install 'mainspring[machinegun]'")
    assert not (tmp_path / "data").exists()


def test_the_machinegun_extra_installs_the_kafka_client_its_sinks_use() -> None:
    root = Path(__file__).resolve().parents[2]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(requirement.startswith("aiokafka") for requirement in extras["machinegun"])

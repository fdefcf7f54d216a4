"""Schemathesis over every endpoint of /openapi.json, against a real server on each engine, with every check.

Every request the description allows is taken, every one it forbids is refused (a 4xx), no answer is a 5xx
(but the contract's 502/504 of a processor: ``schemathesis.toml``), and every answer matches the schema the
server itself publishes, problem+json errors included. The server has a token, as docs/configuration.md sets
one up, and schemathesis sends it (an admin token; its ``ignored_auth`` check sends none and expects 401).
The example count is bounded so the suite stays quick; ``MAINSPRING_FUZZ_EXAMPLES=500 make test`` digs deeper.
(Its pytest plugin does not load under pytest 9, so the test drives its CLI.)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = os.environ.get("MAINSPRING_FUZZ_EXAMPLES", "15")
TOKEN = "fuzz-admin-token"
CONFIG = Path(__file__).with_name("schemathesis.toml")


# Unloaded, the four phases take about a minute on each engine (the coverage phase's boundary cases ~20 s of it);
# a machine shared with other runs takes a few.
@pytest.mark.timeout(600)
def test_every_endpoint_passes_every_schemathesis_check(servers: Any, tmp_path: Path) -> None:
    token = {"token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest(), "scopes": ["admin"], "name": "fuzz"}
    # Long polls would make each example wait up to a minute; the stream never ends by design.
    (server,) = servers(1, env={"MAINSPRING_SERVER__MAX_WAIT_MS": "20", "MAINSPRING_AUTH__TOKENS": json.dumps([token])})
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "schemathesis"),
            "--config-file", str(CONFIG),
            "run",
            server.url + "/openapi.json",
            "--checks", "all",
            "--header", f"Authorization: Bearer {TOKEN}",
            "--max-examples", EXAMPLES,
            "--seed", "1",
            "--phases", "examples,coverage,fuzzing,stateful",
            "--request-timeout", "30",
            "--suppress-health-check", "all",
            "--report-dir", str(tmp_path),
            "--exclude-path", "/v1/events/stream",
            # Thrift binary, not JSON (the Automaton and the polling event sink): tests/machines/test_machinegun_*.py
            # drive it with real Thrift messages, malformed ones included.
            "--exclude-path", "/v1/machinegun/automaton",
            "--exclude-path", "/v1/machinegun/event_sink",
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:] + "\n--- server log ---\n" + server.log()[-3000:]

"""Schemathesis over every endpoint of /openapi.json, against a real server on each engine.

No answer may be a 5xx, and every answer must match the schema the server itself publishes (including
the problem+json shape of its errors). The example count is bounded so the suite stays quick;
``MAINSPRING_FUZZ_EXAMPLES=500 make test`` digs deeper. (Its pytest plugin does not load under pytest 9,
so the test drives its CLI.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

EXAMPLES = os.environ.get("MAINSPRING_FUZZ_EXAMPLES", "15")
CHECKS = "no_internal_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def test_no_endpoint_answers_5xx_or_off_schema(servers: Any, tmp_path: Path) -> None:
    # Long polls would make each example wait up to a minute; the stream never ends by design.
    (server,) = servers(1, env={"MAINSPRING_SERVER__MAX_WAIT_MS": "20"})
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.fuzz.hooks", "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")) if p)}
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "schemathesis"),
            "run",
            server.url + "/openapi.json",
            "--checks", CHECKS,
            "--max-examples", EXAMPLES,
            "--seed", "1",
            "--phases", "examples,fuzzing",
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
        timeout=900,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:] + "\n--- server log ---\n" + server.log()[-3000:]

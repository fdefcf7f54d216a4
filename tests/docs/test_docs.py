"""Every code block of the README and the docs runs, as written, against a real server (see harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ServerProcess
from tests.docs.harness import ROOT, Runner, code_blocks, read_page

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples" / "exchange" / "README.md"]
RUNNABLE = [p for p in PAGES if any(b.skip is None for b in code_blocks(read_page(p)))]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_every_page_with_code_is_run_and_every_skip_says_why() -> None:
    for page in map(read_page, PAGES):
        for block in code_blocks(page):
            assert block.skip is None or len(block.skip) > 10, f"{block.where}: a skipped block must say why"
    assert {p.name for p in RUNNABLE} >= {"README.md", "interactions.md", "batching.md", "exchange.md", "machines.md", "configuration.md"}


@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
async def test_the_code_blocks_of_a_page_run_against_a_real_server(path: Path, database_url: str, tmp_path: Path) -> None:
    page = read_page(path)
    data_dir = tmp_path / "data"
    server = ServerProcess(database_url, data_dir, env={"PYTHONPATH": str(ROOT)}, args=page.serve_args)
    server.start()
    workdir = tmp_path / "work"
    workdir.mkdir()
    try:
        runner = Runner(server.url, database_url, data_dir, workdir)
        for block in code_blocks(page):
            if block.skip is None:
                await runner.run(block)
    finally:
        server.kill()

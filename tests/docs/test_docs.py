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


def test_the_docs_stand_alone_with_the_http_reference_in_the_repository() -> None:
    """A reader has the repository only: no links out of it, no words of the project's private design notes."""
    import re

    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for link in re.findall(r"\]\(([^)#]+)", text):
            if not link.startswith(("http://", "https://", "mailto:")):
                assert (page.parent / link).resolve().is_relative_to(ROOT), f"{page.name}: {link} is outside the repository"
                assert (page.parent / link).exists(), f"{page.name}: {link} does not exist"
        for word in (r"\bseed\b", r"\bGedemin\b", r"API\.md"):
            assert not re.search(word, text, flags=re.I), f"{page.name}: {word}"
    assert "## Interactions" in (ROOT / "docs" / "http.md").read_text(encoding="utf-8")


def test_configuration_and_machinegun_agree_that_every_worker_process_serves_the_listener() -> None:
    configuration = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    [listen] = [line for line in configuration.splitlines() if line.startswith("| `listen` |")]
    assert "every process serves it" in listen, listen
    assert "every process serves the\nlistener" in (ROOT / "docs" / "machinegun.md").read_text(encoding="utf-8")


def test_the_build_report_example_repeats_on_its_first_call() -> None:
    """docs/interactions.md's build_report: a handler sees attempts == 1 on its first call, so that is when the
    `Repeat` must fire."""
    from mainspring import Repeat
    from mainspring.interactions.models import Interaction

    [block] = [b for b in code_blocks(read_page(ROOT / "docs" / "interactions.md")) if "def build_report" in b.code]
    namespace: dict[str, object] = {}
    exec(compile(block.code, block.where, "exec"), namespace)
    first_call = Interaction.model_construct(id="1", queue="reports", data={"wait_for_data": True}, attempts=1)
    assert isinstance(namespace["build_report"](first_call), Repeat)  # type: ignore[operator]

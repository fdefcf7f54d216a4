"""Run the code blocks of a Markdown page against a real server, so the docs cannot rot.

A page's fenced blocks run in order, against one ``mainspring serve`` started for the page:

- ``python``: executed in one namespace per page (later blocks see what earlier ones defined; top-level
  ``await`` works). ``python file=NAME.py`` also writes the block to ``NAME.py`` in the page's work dir,
  so a command like ``mainspring worker NAME:app`` can import it.
- ``sh`` / ``bash``: each command runs in bash in the page's work dir and must exit 0. ``mainspring
  serve`` and ``mainspring worker`` commands keep running: each must become ready (``/readyz``; the
  worker's "runs" line) and then stop cleanly on SIGTERM. A block with ``background`` after its language
  is treated the same way: its command must keep running and accept connections on its ``--port``.
- ``toml``: loaded as the config file (unknown keys and bad values fail).
- Blocks without a language, and ``mermaid`` diagrams, are not code.

The docs write the default address ``127.0.0.1:8080`` / ``localhost:8080``; the harness points it at the
page's server. Commands see ``MAINSPRING_URL`` and the server's database and data dir in the environment.
``<!-- docs-test: serve ARGS -->`` in a page starts its server with ``ARGS`` (for example ``--app
examples.machines.invoices:app``); ``<!-- docs-test: skip REASON -->`` right before a block leaves that
one block out, and says why; ``<!-- docs-test: postgres -->`` runs a block only when the page's store is
PostgreSQL (what only PostgreSQL does: writing in the caller's own transaction). Python blocks see the server's
database and data dir in the environment too, so ``mainspring.producer()`` opens the page's store.
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from markdown_it import MarkdownIt

from mainspring.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
NOT_CODE = {"", "mermaid", "text"}
LONG_RUNNING = re.compile(r"^(?:\w+=\S*\s+)*(?:mainspring|\S*/mainspring)\s+(?:serve|worker)\b")
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s+(?P<reason>.+?)\s*-->")
POSTGRES_ONLY = re.compile(r"<!--\s*docs-test:\s*postgres\s*-->")
SERVE = re.compile(r"<!--\s*docs-test:\s*serve\s+(?P<args>.*?)\s*-->")


@dataclass
class Block:
    page: Path
    line: int
    language: str
    flags: dict[str, str]
    code: str
    skip: str | None = None
    postgres_only: bool = False

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    serve_args: list[str] = field(default_factory=list)


def read_page(path: Path) -> Page:
    text = path.read_text(encoding="utf-8")
    page = Page(path)
    served = SERVE.search(text)
    if served:
        page.serve_args = shlex.split(served["args"])
    lines = text.splitlines()
    for token in MarkdownIt().parse(text):
        if token.type != "fence" or token.map is None:
            continue
        language, *rest = token.info.split() or [""]
        flags = dict(f.split("=", 1) if "=" in f else (f, "") for f in rest)
        before = "\n".join(lines[max(0, token.map[0] - 2):token.map[0]])
        skipped = SKIP.search(before)
        page.blocks.append(Block(path, token.map[0] + 1, language.lower(), flags, token.content,
                                 skipped["reason"] if skipped else None, bool(POSTGRES_ONLY.search(before))))
    return page


def code_blocks(page: Page) -> list[Block]:
    return [b for b in page.blocks if b.language not in NOT_CODE]


def commands(code: str) -> list[str]:
    """Shell commands of a block: continuation lines joined; comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    found = []
    for line in joined.splitlines():
        stripped = strip_comment(line).strip()
        if stripped:
            found.append(stripped)
    return found


def strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes, after a blank or at the start)."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]
    return line


class Runner:
    """Runs one page's blocks against the server at ``url`` (database ``database_url``)."""

    def __init__(self, url: str, database_url: str, data_dir: Path, workdir: Path) -> None:
        self.url = url
        self.address = url.split("://", 1)[1]
        self.database_url = database_url
        self.data_dir = data_dir
        self.workdir = workdir
        self.namespace: dict[str, Any] = {"__name__": "__docs__"}
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
            "PYTHONPATH": f"{workdir}:{ROOT}",
            "MAINSPRING_URL": url,
            "MAINSPRING_SERVER__DATABASE": database_url,
            "MAINSPRING_SERVER__DATA_DIR": str(data_dir),
            "MAINSPRING_SERVER__POLL_INTERVAL_MS": "200",
        }

    def localize(self, code: str) -> str:
        for default in ("http://127.0.0.1:8080", "http://localhost:8080", "127.0.0.1:8080", "localhost:8080"):
            code = code.replace(default, self.url if default.startswith("http") else self.address)
        return code

    async def run(self, block: Block) -> None:
        if block.postgres_only and not self.database_url.startswith("postgresql"):
            return
        code = self.localize(block.code)
        if block.language == "python":
            if "file" in block.flags:
                (self.workdir / block.flags["file"]).write_text(block.code, encoding="utf-8")
            await self.run_python(code, block)
        elif block.language in ("sh", "bash", "shell"):
            script: list[str] = []   # consecutive short commands run as one script: variables carry over
            for command in commands(code):
                if "background" in block.flags or LONG_RUNNING.match(command):
                    if script:
                        await asyncio.to_thread(self.run_command, "\n".join(script), block)
                        script = []
                    await asyncio.to_thread(self.run_long, command, block)
                else:
                    script.append(command)
            if script:
                await asyncio.to_thread(self.run_command, "\n".join(script), block)
        elif block.language == "toml":
            config = self.workdir / "docs-block.toml"
            config.write_text(code, encoding="utf-8")
            load_settings(config)
        else:
            raise AssertionError(f"{block.where}: no way to run a {block.language!r} block")

    async def run_python(self, code: str, block: Block) -> None:
        compiled = compile(code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        cwd = os.getcwd()
        os.chdir(self.workdir)
        sys.path.insert(0, str(self.workdir))
        saved = {k: os.environ.get(k) for k in self.env if k.startswith("MAINSPRING_")}
        os.environ.update({k: self.env[k] for k in saved})
        try:
            result = eval(compiled, self.namespace)
            if asyncio.iscoroutine(result):
                await result
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            sys.path.remove(str(self.workdir))
            os.chdir(cwd)

    def run_command(self, command: str, block: Block) -> None:
        done = subprocess.run(["bash", "-eo", "pipefail", "-c", command], cwd=self.workdir, env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{block.where}: `{command}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"

    def run_long(self, command: str, block: Block) -> None:
        # Fixed ports in the docs become free ones here, so parallel runs never collide.
        command = re.sub(r"(--(?:http-)?port)[ =]\d+", lambda m: f"{m.group(1)} {free_port()}", command)
        if LONG_RUNNING.match(command) and " serve" in command and "--port " not in command:
            command += f" --port {free_port()}"
        port = re.search(r"--(?:http-)?port (\d+)", command)
        log = self.workdir / f"long-{time.monotonic_ns()}.log"
        with log.open("wb") as output:
            proc = subprocess.Popen(["bash", "-c", f"exec env {command}"], cwd=self.workdir, env=self.env, stdout=output,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            ready = self.wait_ready(proc, command, port.group(1) if port else None, log)
            assert ready, f"{block.where}: `{command}` never became ready:\n{log.read_text()[-3000:]}"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        assert proc.returncode in (0, -signal.SIGTERM), f"{block.where}: `{command}` ended with {proc.returncode}:\n{log.read_text()[-3000:]}"

    @staticmethod
    def wait_ready(proc: subprocess.Popen[bytes], command: str, port: str | None, log: Path) -> bool:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            if " worker " in f" {command} " and "mainspring worker runs" in log.read_text(errors="replace"):
                return True
            if port is not None:
                path = "/readyz" if " serve" in command else "/"
                try:
                    httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1)
                    return True
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        return False


def free_port() -> int:
    from tests.conftest import free_port as pick

    return pick()

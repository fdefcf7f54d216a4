"""The wheel, as a user gets it: built, installed into a fresh venv without the extras, and smoke-tested."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, show_log_on_failure

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # As README.md says to build it (the build backend comes from the package index).
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out, ROOT)
    [built] = out.glob("mainspring-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with the bare wheel installed (its dependencies from the package index)."""
    home = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", home)
    run(home / "bin" / "pip", "install", "-q", wheel)
    yield home


def test_the_wheel_carries_the_license_metadata_and_every_file_the_server_needs(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(archive.read(metadata).decode())
    assert meta["License-Expression"] == "Apache-2.0"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert meta["Author"] or meta["Author-email"] or "Mainspring maintainers" in (meta.get("Author") or "")
    assert "Typing :: Typed" in meta.get_all("Classifier")
    extras = set(meta.get_all("Provides-Extra"))
    assert {"postgres", "kafka", "nats"} <= extras
    bare = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    assert not any(r.startswith(("asyncpg", "aiokafka", "nats-py")) for r in bare), bare
    for needed in ("mainspring/ui/static/htmx.min.js", "mainspring/ui/templates/", "mainspring/store/migrations/versions/",
                   "mainspring/client/_sync/interactions.py", "mainspring/py.typed"):
        assert any(n.startswith(needed) for n in names), needed


def test_a_bare_install_serves_on_sqlite_with_the_dashboard_and_has_the_clients(venv: Path, tmp_path: Path) -> None:
    bin_dir = venv / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAINSPRING_", "PYTHONPATH", "VIRTUAL_ENV"))}
    assert run(bin_dir / "mainspring", "--version", env=env).stdout.strip() == "mainspring 0.1.0"
    missing = subprocess.run([bin_dir / "python", "-c", "import asyncpg"], capture_output=True, text=True)
    assert missing.returncode != 0, "asyncpg belongs to mainspring[postgres], not the bare install"
    run(bin_dir / "python", "-c", "from mainspring import App, Interaction, HandlerContext, Package, Complete, Fail, "
        "Repeat, Wait, Retry; from mainspring.client import InteractionsClient, AsyncBatchingClient, MainspringError",
        env=env, cwd=tmp_path)
    database = f"sqlite:///{tmp_path / 'data' / 'mainspring.db'}"
    migrated = run(bin_dir / "mainspring", "migrate", "--data-dir", tmp_path / "data", env=env, cwd=tmp_path)
    assert "schema up to date" in migrated.stdout
    port = free_port()
    log = tmp_path / "serve.log"
    show_log_on_failure("the installed server", log)
    server = subprocess.Popen([bin_dir / "mainspring", "serve", "--port", str(port), "--database", database,
                               "--data-dir", tmp_path / "data"], env=env, cwd=tmp_path, stdout=log.open("wb"),
                              stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the installed server never became ready"
            time.sleep(0.1)
        assert "text/html" in httpx.get(f"{url}/ui/").headers["content-type"]
        assert httpx.get(f"{url}/ui/static/htmx.min.js").status_code == 200
        assert httpx.get(f"{url}/docs/static/swagger-ui-bundle.js").status_code == 200
        created = run(bin_dir / "mainspring", "interactions", "create", "smoke", "--data", '{"n": 1}', "--url", url, env=env)
        assert json.loads(created.stdout)["status"] == "ready"
    finally:
        server.terminate()
        server.wait(30)


def test_make_dist_builds_the_wheel_and_the_sdist_of_the_one_version(tmp_path: Path) -> None:
    from mainspring import __version__

    run("make", "dist", f"DIST={tmp_path}", cwd=ROOT)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"mainspring-{__version__}-py3-none-any.whl", f"mainspring-{__version__}.tar.gz"]
    import tarfile

    with tarfile.open(tmp_path / f"mainspring-{__version__}.tar.gz") as sdist:
        names = sdist.getnames()
    assert f"mainspring-{__version__}/CHANGELOG.md" in names and f"mainspring-{__version__}/src/mainspring/store/releases.py" in names


def test_every_released_version_has_its_changelog_section_and_its_store_heads() -> None:
    """A release a team can upgrade to: the changelog says what changed, store.releases what its stores are at."""
    import re

    from mainspring import __version__
    from mainspring.store.releases import RELEASED_HEADS

    sections = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert sections[0] == "Unreleased" and sections[1:] == list(reversed(RELEASED_HEADS)), sections
    assert __version__ in RELEASED_HEADS or __version__.endswith(".dev0"), __version__

"""The public handler API: what ``from mainspring import …`` gives, typed options, composing apps."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

import mainspring
from mainspring import (
    App,
    AppError,
    Complete,
    Fail,
    HandlerContext,
    Interaction,
    Package,
    Repeat,
    Retry,
    Wait,
)
from mainspring.app import load_app


def test_what_handlers_receive_and_return_is_importable_from_mainspring_and_documented() -> None:
    for name in mainspring.__all__:
        value = getattr(mainspring, name)
        if inspect.isclass(value):
            assert value.__doc__ and value.__doc__.strip(), f"mainspring.{name} has no docstring"
    assert Interaction.model_fields["status"].annotation is str
    assert {f for f in Package.__dataclass_fields__} == {"id", "batcher", "attempts", "tasks"}
    assert callable(HandlerContext.create_child)
    assert Repeat(in_ms=5).in_ms == 5 and Fail("x").error == "x" and Retry("y").error == "y"
    assert Complete({"a": 1}).result == {"a": 1} and Wait() == Wait()


def test_queue_options_are_checked_when_the_decorator_runs() -> None:
    app = App()
    with pytest.raises(AppError, match="concurrency"):
        app.queue("emails", concurrency="five")  # type: ignore[arg-type]
    with pytest.raises(AppError, match="concurrency"):
        app.queue("emails", concurrency=0)
    with pytest.raises(TypeError, match="concurency"):
        app.queue("emails", concurency=5)  # type: ignore[call-arg]

    @app.queue("emails", concurrency=5, timeout_ms=1000)
    async def send(item: Interaction) -> None: ...

    assert app.queues["emails"].options == {"concurrency": 5, "timeout_ms": 1000, "batch": 100}
    with pytest.raises(AppError, match="already registered"):
        app.queue("emails")


def test_batcher_options_are_checked_when_the_decorator_runs() -> None:
    app = App()
    with pytest.raises(AppError, match="incomplete_group"):
        app.batcher("books", incomplete_group="drop")  # type: ignore[arg-type]
    with pytest.raises(AppError, match="max_attempts"):
        app.batcher("books", max_attempts=1.5)  # type: ignore[arg-type]

    @app.batcher("books", min_size=2, linger_ms=500)
    def translate(package: Package) -> None: ...

    assert app.batchers["books"].options == {"concurrency": 1, "max_attempts": 3, "min_size": 2, "linger_ms": 500}


def test_include_composes_apps_and_refuses_a_name_registered_in_both() -> None:
    mail, books = App(), App()
    mail.queue("emails")(lambda item: None)
    books.batcher("books")(lambda package: None)
    books.processor("invoices")(lambda kind, args, machine: {})
    everything = App().include(mail).include(books)
    assert (set(everything.queues), set(everything.batchers), set(everything.processors)) == ({"emails"}, {"books"}, {"invoices"})
    assert everything.describe() == "queues emails; batchers books; processors invoices"
    with pytest.raises(AppError, match="'emails' is registered in both"):
        everything.include(mail)


def test_load_app_says_what_is_wrong_with_an_app_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "handlers.py").write_text("from mainspring import App\napp = App()\nother = 42\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert isinstance(load_app("handlers:app"), App)
    assert isinstance(load_app("handlers"), App)
    with pytest.raises(AppError, match="no module named 'nosuch'"):
        load_app("nosuch:app")
    with pytest.raises(AppError, match="has no attribute 'missing'"):
        load_app("handlers:missing")
    with pytest.raises(AppError, match=r"is a int, not a mainspring\.App"):
        load_app("handlers:other")
    sys.modules.pop("handlers", None)


def test_importing_the_clients_loads_no_server_code() -> None:
    import subprocess

    probe = "import sys, mainspring.client; print(any(m in sys.modules for m in ('fastapi', 'sqlalchemy', 'mainspring.api')))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"

"""``App``: the user's code that Mainspring runs — queue handlers, machine processors, batch workers.

```python
from mainspring import App

app = App()

@app.queue("emails", concurrency=5)
async def send_email(item): ...
```

Each face reads its own registrations (``queues``, ``processors``, ``batchers``) and decides what the
options mean; ``mainspring serve --app module:app`` and ``mainspring worker module:app`` run them.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class Registration:
    target: Any
    options: dict[str, Any] = field(default_factory=dict)


class App:
    def __init__(self) -> None:
        self.queues: dict[str, Registration] = {}
        self.processors: dict[str, Registration] = {}
        self.batchers: dict[str, Registration] = {}

    def queue(self, name: str, **options: Any) -> Callable[[T], T]:
        """Handle the items of interaction queue ``name`` (async or sync function)."""
        return self._register(self.queues, name, options)

    def processor(self, namespace: str, **options: Any) -> Callable[[T], T]:
        """Process the machines of ``namespace`` in-process (a processor class or object, async or sync)."""
        return self._register(self.processors, namespace, options)

    def batcher(self, name: str, **options: Any) -> Callable[[T], T]:
        """Work on whole packages of batcher ``name`` (async or sync function)."""
        return self._register(self.batchers, name, options)

    @staticmethod
    def _register(table: dict[str, Registration], name: str, options: dict[str, Any]) -> Callable[[T], T]:
        def decorator(target: T) -> T:
            if name in table:
                raise ValueError(f"{name!r} is already registered")
            table[name] = Registration(target, options)
            return target

        return decorator


def load_app(spec: str) -> App:
    """``package.module:attribute`` → the App it names."""
    module_name, _, attribute = spec.partition(":")
    # Like uvicorn: the directory the command runs in is importable, so `--app examples.books:app` works.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    app = getattr(module, attribute or "app")
    if not isinstance(app, App):
        raise TypeError(f"{spec} is not a mainspring.App")
    return app

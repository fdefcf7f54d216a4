"""Mainspring: a durable processing server and Python library.

What your code uses, importable from here:

```python
from mainspring import App, Interaction, HandlerContext, Package, Complete, Fail, Repeat, Wait, Retry
```
The clients live in ``mainspring.client``; every error is a ``mainspring.MainspringError``.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from mainspring.app import App, AppError, BatcherOptions, QueueOptions
    from mainspring.batching.worker import BatchPackage as Package
    from mainspring.batching.worker import BatchTask as PackageTask
    from mainspring.core.errors import ForeignConnection, MainspringError, NeedsPostgres
    from mainspring.interactions.models import Interaction
    from mainspring.interactions.outcomes import Complete, Fail, Outcome, Repeat, Retry, Wait
    from mainspring.interactions.worker import HandlerContext
    from mainspring.producer import Producer, producer
    from mainspring.workflows.engine import Workflow
    from mainspring.workflows.errors import ChildFailed, StepFailed, TaskFailed

# Imported on first use, so that `import mainspring.client` stays light (no server code is loaded).
_EXPORTS = {
    "App": ("mainspring.app", "App"),
    "AppError": ("mainspring.app", "AppError"),
    "BatcherOptions": ("mainspring.app", "BatcherOptions"),
    "QueueOptions": ("mainspring.app", "QueueOptions"),
    "Package": ("mainspring.batching.worker", "BatchPackage"),
    "PackageTask": ("mainspring.batching.worker", "BatchTask"),
    "MainspringError": ("mainspring.core.errors", "MainspringError"),
    "ForeignConnection": ("mainspring.core.errors", "ForeignConnection"),
    "NeedsPostgres": ("mainspring.core.errors", "NeedsPostgres"),
    "Interaction": ("mainspring.interactions.models", "Interaction"),
    "Complete": ("mainspring.interactions.outcomes", "Complete"),
    "Fail": ("mainspring.interactions.outcomes", "Fail"),
    "Outcome": ("mainspring.interactions.outcomes", "Outcome"),
    "Repeat": ("mainspring.interactions.outcomes", "Repeat"),
    "Retry": ("mainspring.interactions.outcomes", "Retry"),
    "Wait": ("mainspring.interactions.outcomes", "Wait"),
    "HandlerContext": ("mainspring.interactions.worker", "HandlerContext"),
    "Producer": ("mainspring.producer", "Producer"),
    "producer": ("mainspring.producer", "producer"),
    "Workflow": ("mainspring.workflows.engine", "Workflow"),
    "StepFailed": ("mainspring.workflows.errors", "StepFailed"),
    "ChildFailed": ("mainspring.workflows.errors", "ChildFailed"),
    "TaskFailed": ("mainspring.workflows.errors", "TaskFailed"),
}

__all__ = [
    "App",
    "AppError",
    "BatcherOptions",
    "ChildFailed",
    "Complete",
    "Fail",
    "ForeignConnection",
    "HandlerContext",
    "Interaction",
    "MainspringError",
    "NeedsPostgres",
    "Outcome",
    "Package",
    "PackageTask",
    "Producer",
    "QueueOptions",
    "Repeat",
    "Retry",
    "StepFailed",
    "TaskFailed",
    "Wait",
    "Workflow",
    "__version__",
    "producer",
]


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mainspring' has no attribute {name!r}")
    import importlib

    module, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


class _Package(types.ModuleType):
    """``mainspring.producer`` is a function and a module of the same name: importing the module binds it onto the
    package afterwards, which would make ``from mainspring import producer`` answer the module from then on."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "producer" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

"""Errors of workflows: what a workflow's code sees (``StepFailed``, ``ChildFailed``, ``TaskFailed``) and what the
API answers (API.md §5's codes)."""

from __future__ import annotations

from mainspring.core.errors import Conflict, NotFound


class StepFailed(Exception):
    """A step raised on its last attempt (or the run replays such a record): ``type`` and ``message`` are its
    exception's."""

    def __init__(self, type: str, message: str) -> None:
        super().__init__(f"{type}: {message}")
        self.type = type
        self.message = message


class ChildFailed(Exception):
    """A child run failed (``type``, ``message``: its error) or was cancelled (``type`` ``cancelled``)."""

    def __init__(self, type: str, message: str) -> None:
        super().__init__(f"{type}: {message}")
        self.type = type
        self.message = message


class TaskFailed(Exception):
    """A task's interaction failed or was cancelled; ``error`` is what it failed with (``cancelled`` when it was)."""

    def __init__(self, error: str | None, status: str = "failed") -> None:
        super().__init__(error or status)
        self.error = error if error is not None else status
        self.status = status


def error_of(exc: BaseException) -> dict[str, str | None]:
    """An exception as a record keeps it: its type's name and message."""
    return {"type": getattr(exc, "type", None) if isinstance(exc, StepFailed | ChildFailed) else type(exc).__name__, "message": str(exc)}


class WorkflowNotFound(NotFound):
    code, title = "workflow_not_found", "No such workflow"


class RunNotFound(NotFound):
    code, title = "run_not_found", "No such run"


class RunFinished(Conflict):
    code, title = "run_finished", "The run has finished"


class RunNotFailed(Conflict):
    code, title = "run_not_failed", "Only a failed run can be retried"

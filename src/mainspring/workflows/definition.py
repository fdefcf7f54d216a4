"""What ``App.workflow`` registers: the function, and the in-process processor of its namespace (a
``machines.processor.Driver``: the machines loop hands it the runs that are due)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NoReturn

from mainspring.machines.processor import Unprocessable

if TYPE_CHECKING:
    from mainspring.core.runtime import Context
    from mainspring.machines.data import MachineRow

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
"""A workflow's name: its machines' namespace, and part of its tasks' message ids (``wf:<name>:<id>:<n>``)."""


class WorkflowProcessor:
    """The processor of a workflow's namespace: runs are started and advanced by the workflows layer, never by
    the machines API's Start or Call."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def drive(self, ctx: Context, machine: MachineRow) -> None:
        from mainspring.workflows.runner import runner_of

        await runner_of(ctx).drive(machine)

    def _refuse(self, *_: object) -> NoReturn:
        raise Unprocessable(f"runs of workflow {self.name!r} are started and advanced through /v1/workflows/{self.name}")

    init = call = timeout = notification = repair = _refuse

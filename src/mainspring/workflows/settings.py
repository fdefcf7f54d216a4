"""Settings of workflows (section `[workflows]` of the config file, env `MAINSPRING_WORKFLOWS__<KEY>`)."""

from pydantic import BaseModel, ConfigDict, Field


class WorkflowsSettings(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    lease_ms: int = Field(30_000, ge=100, le=3_600_000)
    """How long a server holds a run it advances without writing; renewed while a step runs. A server that dies
    leaves its runs to the others after this."""
    keep_ms: int = Field(30_000, ge=0)
    """How long a run that sleeps or waits keeps its coroutine in memory, so that waking it needs no replay."""
    keep_max: int = Field(10_000, ge=0)
    """At most this many sleeping or waiting runs keep their coroutine in memory (the least recently used go first)."""

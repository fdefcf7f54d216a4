"""Settings of the batching face (section `[batching]` of the config file, env `MAINSPRING_BATCHING__<KEY>`).

Each batcher's own rules (sizes, timers, leases) are stored per batcher (``PUT /v1/batchers/{name}``),
not here, so they change at runtime on every server at once.
"""

from pydantic import BaseModel, ConfigDict, Field


class BatchingSettings(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    worker_poll_ms: int = Field(1_000, ge=10)
    """How long an in-process ``@app.batcher`` worker long-polls between checks of the stop signal."""
    retention_ms: int | None = Field(7 * 86_400_000, ge=0)
    """Finished packages (done or failed) and their tasks, and rejected tasks, are deleted this long after
    they finished (None: kept). The version log is never deleted, so duplicates are still recognised; the
    task holding each member's latest accepted content is kept too, for a later reissue."""
    retention_interval_ms: int = Field(60_000, ge=10)
    """How often each server deletes what ``retention_ms`` lets go."""
    retention_batch: int = Field(500, ge=1)
    """Packages (and rejected tasks) deleted per transaction by the retention loop."""

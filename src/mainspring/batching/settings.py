"""Settings of the batching face (section `[batching]` of the config file, env `MAINSPRING_BATCHING__<KEY>`).

Each batcher's own rules (sizes, timers, leases) are stored per batcher (``PUT /v1/batchers/{name}``),
not here, so they change at runtime on every server at once.
"""

from pydantic import BaseModel, ConfigDict, Field


class BatchingSettings(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    worker_poll_ms: int = Field(1_000, ge=10)
    """How long an in-process ``@app.batcher`` worker long-polls between checks of the stop signal."""

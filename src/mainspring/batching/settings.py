"""Settings of the batching face (section `[batching]` of the config file, env `MAINSPRING_BATCHING__<KEY>`)."""

from pydantic import BaseModel


class BatchingSettings(BaseModel):
    pass

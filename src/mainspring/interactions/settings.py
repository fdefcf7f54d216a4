"""Settings of the interactions face (section `[interactions]` of the config file, env `MAINSPRING_INTERACTIONS__<KEY>`)."""

from pydantic import BaseModel


class InteractionsSettings(BaseModel):
    pass

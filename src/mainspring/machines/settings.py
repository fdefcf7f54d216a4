"""Settings of the machines face (section `[machines]` of the config file, env `MAINSPRING_MACHINES__<KEY>`)."""

from pydantic import BaseModel


class MachinesSettings(BaseModel):
    pass

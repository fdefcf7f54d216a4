"""The machines face as the server mounts it."""

from mainspring.core.runtime import Face
from mainspring.machines.routes import router

face = Face(name="machines", router=router)

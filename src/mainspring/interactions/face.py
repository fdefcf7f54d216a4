"""The interactions face as the server mounts it."""

from mainspring.core.runtime import Face
from mainspring.interactions.routes import router

face = Face(name="interactions", router=router)

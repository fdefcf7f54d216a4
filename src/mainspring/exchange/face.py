"""The exchange face as the server mounts it."""

from mainspring.core.runtime import Face
from mainspring.exchange.routes import router

face = Face(name="exchange", router=router)

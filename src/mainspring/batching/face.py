"""The batching face as the server mounts it."""

from mainspring.batching.routes import router
from mainspring.core.runtime import Face

face = Face(name="batching", router=router)

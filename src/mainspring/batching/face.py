"""The batching face as the server mounts it."""

from mainspring.batching.cli import cli
from mainspring.batching.dispatcher import dispatcher_loop
from mainspring.batching.routes import router
from mainspring.batching.worker import recover, workers_loop
from mainspring.core.runtime import Face

face = Face(name="batching", router=router, recover=recover, loops=[dispatcher_loop, workers_loop], cli=cli)

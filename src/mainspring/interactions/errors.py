"""Errors of the interactions face, with the codes API.md §3 names."""

from mainspring.core.errors import Conflict, NotFound


class InteractionNotFound(NotFound):
    code, title = "interaction_not_found", "No such interaction"


class ParentNotFound(NotFound):
    code, title = "parent_not_found", "No such parent interaction"


class QueueNotFound(NotFound):
    code, title = "queue_not_found", "No such queue"


class InteractionFinished(Conflict):
    code, title = "interaction_finished", "The interaction is already finished"


class InteractionNotFinished(Conflict):
    code, title = "interaction_not_finished", "The interaction is not finished"


class PeriodicNotFound(NotFound):
    code, title = "periodic_not_found", "No such periodic schedule"

"""The batching face's errors, with the codes API.md §4 names."""

from mainspring.core.errors import Conflict, InvalidRequest, LeaseLost, NotFound


class BatcherNotFound(NotFound):
    code, title = "batcher_not_found", "No such batcher"


class TaskNotFound(NotFound):
    code, title = "task_not_found", "No such task in this batcher"


class PackageNotFound(NotFound):
    code, title = "package_not_found", "No such package"


class TaskIdConflict(Conflict):
    code, title = "task_id_conflict", "This task id is already used with other content"


class BatcherBusy(Conflict):
    code, title = "batcher_busy", "A package of this batcher is claimed and its lease has not expired"


class InvalidBatcherSettings(InvalidRequest):
    pass


class UnknownTaskResult(InvalidRequest):
    pass


__all__ = [
    "BatcherBusy",
    "BatcherNotFound",
    "InvalidBatcherSettings",
    "LeaseLost",
    "PackageNotFound",
    "TaskIdConflict",
    "TaskNotFound",
    "UnknownTaskResult",
]

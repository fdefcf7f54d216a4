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


class BatcherSettingsConflict(Conflict):
    """A PUT whose fields, with the batcher's stored ones it leaves unchanged, contradict each other (``min_size``
    or ``group_size`` over ``max_size``). A 409, not a 422: the body alone may be valid — whether it fits depends
    on what is stored."""

    code, title = "batcher_settings_conflict", "These settings contradict the batcher's others"


class UnknownTaskResult(InvalidRequest):
    pass


__all__ = [
    "BatcherBusy",
    "BatcherNotFound",
    "BatcherSettingsConflict",
    "InvalidBatcherSettings",
    "LeaseLost",
    "PackageNotFound",
    "TaskIdConflict",
    "TaskNotFound",
    "UnknownTaskResult",
]

"""Errors of the exchange face, with the codes API.md names."""

from mainspring.core.errors import Conflict, InvalidRequest, NotFound, TooLarge, Unavailable

__all__ = [
    "AlreadyCommitted",
    "Busy",
    "Cancelled",
    "InvalidRequest",
    "MessageIdConflict",
    "MessageNotFound",
    "MessagesUnavailable",
    "NotInDoubt",
    "ProcessNotFound",
    "StorageUnavailable",
    "TooLarge",
]


class MessageNotFound(NotFound):
    code, title = "message_not_found", "No such message, or it is no longer available"


class ProcessNotFound(NotFound):
    code, title = "process_not_found", "No such process"


class MessageIdConflict(Conflict):
    code, title = "message_id_conflict", "This Message-Id is already stored with other bytes"


class Busy(Conflict):
    code, title = "busy", "Another process holds this mailbox"


class MessagesUnavailable(Conflict):
    code, title = "messages_unavailable", "Some messages are unknown, of another mailbox, or not available"


class Cancelled(Conflict):
    code, title = "cancelled", "The process is cancelled or unknown"


class NotInDoubt(Conflict):
    code, title = "not_in_doubt", "The process is not IN_DOUBT"


class AlreadyCommitted(Conflict):
    code, title = "already_committed", "The process was already reported committed"


class StorageUnavailable(Unavailable):
    code, title = "storage_unavailable", "The message files could not be written; nothing was stored"

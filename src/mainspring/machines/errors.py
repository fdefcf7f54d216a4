"""Errors of the machines face, with the codes API.md §2 names."""

from __future__ import annotations

from mainspring.core.errors import Conflict, MainspringError, NotFound


class NamespaceNotFound(NotFound):
    code, title = "namespace_not_found", "No such namespace"


class MachineNotFound(NotFound):
    code, title = "machine_not_found", "No such machine"


class OperationNotFound(NotFound):
    code, title = "operation_not_found", "No operation with this Idempotency-Key took effect"


class MachineAlreadyExists(Conflict):
    code, title = "machine_already_exists", "A machine with this id already exists"


class MachineFailed(Conflict):
    code, title = "machine_failed", "The machine is failed; repair it first"


class MachineAlreadyWorking(Conflict):
    code, title = "machine_already_working", "The machine is working; there is nothing to repair"


class MachineBusy(Conflict):
    code, title = "machine_busy", "Other steps kept changing the machine; try again"


class IdempotencyKeyReused(Conflict):
    code, title = "idempotency_key_reused", "This Idempotency-Key was used for another operation"


class ProcessorFailed(MainspringError):
    status, code, title = 502, "processor_failed", "The processor failed"


class ProcessorTimeout(MainspringError):
    status, code, title = 504, "processor_timeout", "The processor did not answer in time"


class ProcessorRefused(MainspringError):
    """The processor refused for good (``422 unprocessable``, ``Unprocessable`` raised, a malformed answer):
    the same request will never succeed. A Call's machine is now failed; a Start created nothing."""

    status, code, title = 502, "processor_refused", "The processor refused the request"


class DeadlineReached(MainspringError):
    """The caller's deadline passed during the step; nothing was written (the processor may have been called)."""

    status, code, title = 504, "deadline_reached", "The caller's deadline passed; nothing was written"

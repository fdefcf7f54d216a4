"""Settings of the exchange face (section ``[exchange]``, env ``MAINSPRING_EXCHANGE__<KEY>``)."""

from pydantic import BaseModel, ConfigDict, Field


class ExchangeSettings(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    process_timeout_ms: int = Field(300_000, ge=1)
    """How long a STARTED process may live without a heartbeat before the watchdog cancels it."""
    commit_timeout_ms: int = Field(600_000, ge=1)
    """How long a READY_TO_COMMIT process may wait for API_4/API_5 before it turns IN_DOUBT."""
    watchdog_interval_ms: int = Field(1000, ge=1)
    """How often each server's watchdog looks for processes past their deadline."""
    backup: bool = False
    """Keep committed message files in ``backup/`` instead of deleting them."""
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1)
    """Largest message body (``413 too_large`` above)."""
    cleanup_retry_ms: int = Field(5_000, ge=1)
    """How long to wait before retrying a file move or delete that failed (the disk may come back)."""
    cleanup_retry_max_ms: int = Field(300_000, ge=1)
    """Upper bound of the doubling retry delay of a failing file move or delete."""
    cleanup_alert_after: int = Field(5, ge=1)
    """Raise an alert once a process's cleanup (or a message file move) has failed this many times."""
    orphan_grace_ms: int = Field(600_000, ge=1000)
    """A message file under ``mailboxes/`` that no message refers to is deleted once it is this old (a store
    killed between writing the body and recording it; it was never acknowledged)."""
    orphan_sweep_interval_ms: int = Field(600_000, ge=1000)
    """How often each server looks for such files (and once at start-up)."""
    batch_size: int = Field(500, ge=1, le=10_000)
    """How many processes or files the watchdog and start-up recovery handle per transaction."""
    finished_retention_ms: int | None = Field(86_400_000, ge=0)
    """DONE and ABORTED processes, with the message rows that were theirs (committed or discarded), are removed
    this long after they finished and their files were dealt with (0: at once; None: kept). A message's
    ``Message-Id`` is idempotent only while its row is kept."""
    retention_interval_ms: int = Field(60_000, ge=10)
    """How often each server looks for finished processes to remove (they are also removed when they fall
    due, and at once with ``finished_retention_ms = 0``)."""
    metrics_max_mailboxes: int = Field(100, ge=1, le=10_000)
    """``/metrics`` shows waiting messages for at most this many mailboxes (those with the most); the rest are
    summed under ``mailbox="_other"``, so the number of series stays bounded."""

"""Settings of the interactions face (section `[interactions]` of the config file, env `MAINSPRING_INTERACTIONS__<KEY>`)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class InteractionsSettings(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    lease_ms: int = Field(30_000, ge=1)
    """Default lease of a queue created without settings."""
    error_delay_ms: int = Field(1_000, ge=0)
    """Default delay before a failed attempt is retried (the first one, with exponential backoff)."""
    backoff: Literal["fixed", "exponential"] = "fixed"
    """Default backoff: ``fixed`` waits ``error_delay_ms`` after every failed attempt; ``exponential`` waits
    ``min(error_delay_ms × 2^(n−1), max_delay_ms)`` after the n-th."""
    max_delay_ms: int = Field(3_600_000, ge=0)
    """Default cap on an exponential backoff's delay."""
    jitter: bool = False
    """Default jitter: each retry delay is drawn uniformly between 0 and the backoff's delay, so items that
    failed together are not retried together."""
    max_attempts: int = Field(10, ge=1)
    """Default attempts before an item fails for good."""
    processing_timeout_ms: int | None = Field(None, ge=1)
    """Default processing timeout (None: none; leases still expire)."""
    retention_ms: int | None = Field(7 * 86_400_000, ge=0)
    """Finished items of a queue created without its own setting are deleted this long after they finished
    (None: kept)."""
    retention_interval_ms: int = Field(60_000, ge=10)
    """How often each server deletes finished items past their queue's retention."""
    retention_batch: int = Field(500, ge=1)
    """Items deleted per transaction by the retention loop."""
    expiry_interval_ms: int = Field(1_000, ge=10)
    """How often a server looks for expired leases of queues nobody is leasing from."""

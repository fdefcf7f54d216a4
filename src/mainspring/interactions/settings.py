"""Settings of the interactions face (section `[interactions]` of the config file, env `MAINSPRING_INTERACTIONS__<KEY>`)."""

from pydantic import BaseModel, Field


class InteractionsSettings(BaseModel):
    lease_ms: int = Field(30_000, ge=1)
    """Default lease of a queue created without settings."""
    error_delay_ms: int = Field(1_000, ge=0)
    max_attempts: int = Field(10, ge=1)
    processing_timeout_ms: int | None = Field(None, ge=1)
    retention_ms: int | None = Field(None, ge=0)
    max_wait_ms: int = Field(60_000, ge=0)
    """Longest long-poll a lease or a read may ask for."""
    retention_interval_ms: int = Field(60_000, ge=10)
    retention_batch: int = Field(500, ge=1)
    expiry_interval_ms: int = Field(1_000, ge=10)
    """How often a server looks for expired leases of queues nobody is leasing from."""

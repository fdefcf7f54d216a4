"""Settings of the exchange face (section ``[exchange]``, env ``MAINSPRING_EXCHANGE__<KEY>``)."""

from pydantic import BaseModel, Field


class ExchangeSettings(BaseModel):
    process_timeout_ms: int = Field(300_000, ge=1)
    """How long a STARTED process may live without a heartbeat before the watchdog cancels it."""
    commit_timeout_ms: int = Field(600_000, ge=1)
    """How long a READY_TO_COMMIT process may wait for API_4/API_5 before it turns IN_DOUBT."""
    watchdog_interval_ms: int = Field(1000, ge=1)
    backup: bool = False
    """Keep committed message files in ``backup/`` instead of deleting them."""
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1)

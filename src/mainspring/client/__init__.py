"""Python clients for the Mainspring HTTP API (sync and async, httpx)."""

"""Python clients for Mainspring's faces (sync and async, over httpx)."""

"""Clients of the interactions face (API.md §3).

```python
from mainspring.client.interactions import AsyncInteractionsClient

async with AsyncInteractionsClient("http://127.0.0.1:8080", token="ms_…") as client:
    item = await client.create("emails", {"to": "a@b.c"}, message_id="order-17")
    done = await client.get(item["id"], wait_ms=30_000)
```
``InteractionsClient`` has the same methods, blocking. Errors are ``mainspring.MainspringError``s.
"""

from mainspring.client._async.interactions import AsyncInteractionsClient
from mainspring.client._sync.interactions import InteractionsClient
from mainspring.client.errors import ApiError

InteractionsError = ApiError
"""The name this error had before every client shared ``mainspring.client.errors``."""

__all__ = ["AsyncInteractionsClient", "InteractionsClient", "InteractionsError"]

"""Clients of the batching face (API.md §4).

```python
from mainspring.client.batching import BatchingClient

with BatchingClient("http://127.0.0.1:8080", token="ms_…") as client:
    client.put_batcher("books", min_size=2, max_size=6, linger_ms=5000)
    task = client.submit("books", id="book-79-en", group="79", member="en", content="…")
    package = client.claim("books", worker="w1", wait_ms=10_000)
    if package:
        client.complete(package["id"], package["lease"]["token"])
```
``AsyncBatchingClient`` has the same methods, awaited. Errors are ``mainspring.MainspringError``s.
"""

from mainspring.client._async.batching import AsyncBatchingClient
from mainspring.client._sync.batching import BatchingClient
from mainspring.client.errors import ApiError

BatchingError = ApiError
"""The name this error had before every client shared ``mainspring.client.errors``."""

__all__ = ["AsyncBatchingClient", "BatchingClient", "BatchingError"]

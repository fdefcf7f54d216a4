"""Clients of the machines face (the Automaton API of API.md §2).

```python
from mainspring.client.machines import MachinesClient

with MachinesClient("http://127.0.0.1:8080", token="ms_…") as mg:
    mg.put_namespace("invoices", url="http://127.0.0.1:9000/", timeout_ms=5000)
    mg.start("invoices", "inv-1", {"amount": 100}, idempotency_key="start-inv-1")
    mg.call("invoices", "inv-1", {"amount": 100}, idempotency_key="pay-1")
    print(mg.get("invoices", "inv-1")["history"])
```
``AsyncMachinesClient`` has the same methods, awaited. Errors are ``mainspring.MainspringError``s; a processor
that refuses for good (422 ``unprocessable``) is ``ProcessorRefused`` (502 ``processor_refused``), which is not
retried, while one that failed or timed out is ``ServiceUnavailable`` (502 ``processor_failed``, 504
``processor_timeout``), which calls with an ``idempotency_key`` retry.
"""

from mainspring.client._async.machines import AsyncMachinesClient
from mainspring.client._sync.machines import MachinesClient
from mainspring.client.errors import ApiError, ProcessorRefused

MachinesError = ApiError
"""The name this error had before every client shared ``mainspring.client.errors``."""

__all__ = ["AsyncMachinesClient", "MachinesClient", "MachinesError", "ProcessorRefused"]

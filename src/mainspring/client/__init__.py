"""Python clients for every face of a Mainspring server, sync (over urllib3) and async (over aiohttp).

```python
from mainspring.client import InteractionsClient

with InteractionsClient("http://127.0.0.1:8080", token="ms_…") as client:
    item = client.create("emails", {"to": "a@b.c"}, message_id="order-17")
```
Each face has a blocking client and an ``Async…`` twin with the same methods, generated from one
description (``client/_async``). Every error is a ``mainspring.MainspringError`` with ``status``, ``code``
and ``detail``; a server that cannot be reached is ``ServiceUnavailable``. Calls that are safe to repeat
are retried under one policy (``mainspring.client.policy.RetryPolicy``).
"""

from mainspring.client._async.batching import AsyncBatchingClient
from mainspring.client._async.events import AsyncEventsClient
from mainspring.client._async.exchange import AsyncExchangeClient
from mainspring.client._async.interactions import AsyncInteractionsClient
from mainspring.client._async.machines import AsyncMachinesClient
from mainspring.client._async.workflows import AsyncWorkflowsClient
from mainspring.client._sync.batching import BatchingClient
from mainspring.client._sync.events import EventsClient
from mainspring.client._sync.exchange import ExchangeClient
from mainspring.client._sync.interactions import InteractionsClient
from mainspring.client._sync.machines import MachinesClient
from mainspring.client._sync.workflows import WorkflowsClient
from mainspring.client.errors import (
    ApiError,
    Busy,
    Cancelled,
    Conflict,
    Forbidden,
    InteractionCancelled,
    InteractionFailed,
    InvalidRequest,
    InvalidURL,
    LeaseLost,
    MainspringError,
    MessagesUnavailable,
    NoMainspringApi,
    NotFound,
    ProcessorRefused,
    RateLimited,
    ResultTimeout,
    ServiceUnavailable,
    TooLarge,
    Unauthenticated,
    WorkflowCancelled,
    WorkflowFailed,
)
from mainspring.client.models import Reply
from mainspring.client.policy import RetryPolicy

__all__ = [
    "ApiError",
    "AsyncBatchingClient",
    "AsyncEventsClient",
    "AsyncExchangeClient",
    "AsyncInteractionsClient",
    "AsyncMachinesClient",
    "AsyncWorkflowsClient",
    "BatchingClient",
    "Busy",
    "Cancelled",
    "Conflict",
    "EventsClient",
    "ExchangeClient",
    "Forbidden",
    "InteractionCancelled",
    "InteractionFailed",
    "InteractionsClient",
    "InvalidRequest",
    "InvalidURL",
    "LeaseLost",
    "MachinesClient",
    "MainspringError",
    "MessagesUnavailable",
    "NoMainspringApi",
    "NotFound",
    "ProcessorRefused",
    "RateLimited",
    "Reply",
    "ResultTimeout",
    "RetryPolicy",
    "ServiceUnavailable",
    "TooLarge",
    "Unauthenticated",
    "WorkflowCancelled",
    "WorkflowFailed",
    "WorkflowsClient",
]

"""Clients of the event log and the alerts (``EventsClient``, ``AsyncEventsClient``)."""

from mainspring.client._async.events import AsyncEventsClient
from mainspring.client._sync.events import EventsClient

__all__ = ["AsyncEventsClient", "EventsClient"]

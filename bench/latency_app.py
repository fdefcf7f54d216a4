"""The handler of the create → handler latency probe (``bench/interactions.py``): it tells the bench, over UDP,
the wall-clock moment it started on which item."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from mainspring.app import App

app = App()
_probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
_bench = ("127.0.0.1", int(os.environ.get("MS_LATENCY_PORT", "0")))


@app.queue("latency", concurrency=4)
async def started(item: Any) -> None:
    _probe.sendto(f"{item.id} {time.time()}".encode(), _bench)

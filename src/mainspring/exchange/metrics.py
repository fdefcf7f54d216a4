"""Prometheus metrics of the exchange face (see ``core.metrics``).

``mainspring_exchange_processes{state="IN_DOUBT"} > 0`` is the one to page on: an administrator (or the
client's marker table) must say whether that commit happened. Every state is shown, 0 included, so an alert
rule never meets a missing series. Waiting messages are labelled by mailbox (``<addressee>/<database>``) for
the ``exchange.metrics_max_mailboxes`` fullest mailboxes only; the rest are summed under ``_other``, as phones
can make as many mailboxes as there are phones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Gauge

from mainspring.core.metrics import set_all
from mainspring.exchange import data
from mainspring.exchange.models import STATES

if TYPE_CHECKING:
    from mainspring.core.runtime import Context

OTHER_MAILBOXES = "_other"

PROCESSES = Gauge("mainspring_exchange_processes", "Exchange processes by state (IN_DOUBT needs an answer)", ["state"])
WAITING = Gauge(
    "mainspring_exchange_messages_waiting", "Messages available for processing, by mailbox (<addressee>/<database>)",
    ["mailbox"],
)


async def read_gauges(ctx: Context) -> None:
    async with ctx.store.read() as conn:
        by_state = await data.count_processes_by_state(conn)
        fullest, total = await data.most_waiting_mailboxes(conn, ctx.settings.exchange.metrics_max_mailboxes)
    set_all(PROCESSES, (((state,), by_state.get(state, 0)) for state in STATES))
    series = [((f"{m.addressee}/{m.database}",), m.count) for m in fullest]
    rest = total - sum(m.count for m in fullest)
    if rest:
        series.append(((OTHER_MAILBOXES,), rest))
    set_all(WAITING, series)

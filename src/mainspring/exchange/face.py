"""The exchange face as the server mounts it."""

from mainspring.exchange import metrics
from mainspring.exchange.alerts import FIXED_ALERTS
from mainspring.exchange.cli import cli
from mainspring.exchange.orphans import orphan_sweeper
from mainspring.exchange.retention import retention_loop
from mainspring.exchange.routes import routes
from mainspring.exchange.tables import exchange_counts
from mainspring.exchange.watchdog import recover, watchdog
from mainspring.face import Face

face = Face(
    name="exchange", routes=routes, recover=recover, loops=[watchdog, orphan_sweeper, retention_loop], cli=cli,
    read_gauges=metrics.read_gauges, fixed_alerts=FIXED_ALERTS, kept_counts=[exchange_counts],
)

"""The store: SQLite or PostgreSQL behind one interface, its migrations, and the clock."""

from mainspring.store.clock import Clock, ManualClock, format_time, parse_time
from mainspring.store.engine import Store, Transaction

__all__ = ["Clock", "ManualClock", "Store", "Transaction", "format_time", "parse_time"]

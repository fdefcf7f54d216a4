"""The cron expressions a periodic schedule takes, as one regular expression.

The pattern is what ``PUT /v1/periodic/{name}`` validates and what ``/openapi.json`` shows, so a client (or a
fuzzer) knows exactly which expressions are taken: five fields — minute, hour, day of month, month, day of
week — each ``*``, ``*/step``, or a comma list of numbers, ranges ``a-b`` (a ≤ b) and ranges with a step
``a-b/step``; months and days of the week also by name (``JAN``, ``MON``). Every expression it matches is one
the scheduler (cronsim) follows: a day of month over 29 goes only with every month (``*`` or ``*/step``), since
``30 2`` never comes.
"""

from __future__ import annotations


def _digits(low: int, high: int) -> str:
    return str(low) if low == high else f"[{low}-{high}]"


def _numbers(low: int, high: int) -> str:
    """A regex alternation matching the decimal numbers low..high (0 ≤ low ≤ high ≤ 99, no leading zeros),
    two digits before one (so a regex engine trying them in order does not stop at ``3`` of ``31``)."""
    parts = []
    for tens in range(high // 10, max(low, 10) // 10 - 1, -1):
        if tens == 0:
            break
        first = low % 10 if tens == low // 10 else 0
        last = high % 10 if tens == high // 10 else 9
        parts.append(f"{tens}{_digits(first, last)}")
    if low <= 9:
        parts.append(_digits(low, min(high, 9)))
    return "|".join(parts)


def _field(low: int, high: int, names: tuple[str, ...] = ()) -> str:
    number = f"(?:{_numbers(low, high)})"
    step = f"(?:{_numbers(1, high - low + 1)})"
    # a-b with a ≤ b: for each a, the numbers from a up (longest first, so a regex engine tries them in order).
    ranged = "(?:" + "|".join(f"{a}-(?:{_numbers(a, high)})" for a in range(low, high + 1)) + ")"
    item = f"(?:{ranged}(?:/{step})?|{number}" + "".join(f"|{name}" for name in names) + ")"
    return rf"(?:\*(?:/{step})?|{item}(?:,{item})*)"


MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_MONTH_EVERY = r"\*(?:/(?:" + _numbers(1, 12) + "))?"

CRON_PATTERN = (
    "^" + _field(0, 59) + " " + _field(0, 23) + " "
    + "(?:" + _field(1, 31) + " " + _MONTH_EVERY + "|" + _field(1, 29) + " " + _field(1, 12, MONTHS) + ")"
    + " " + _field(0, 7, WEEKDAYS) + "$"
)
"""Minute, hour, day of month, month, day of week (0 and 7 are Sunday), one space apart."""

__all__ = ["CRON_PATTERN"]

"""The interactions face: a durable queue of long-lived items (API.md §3).

Handlers return outcomes: ``from mainspring.interactions import Complete, Fail, Repeat, Retry, Wait``.
"""

from mainspring.interactions.outcomes import Complete, Fail, Outcome, Repeat, Retry, Wait

__all__ = ["Complete", "Fail", "Outcome", "Repeat", "Retry", "Wait"]

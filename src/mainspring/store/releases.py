"""The schema each released version left a store at: its migration heads, one per face.

A store written by a release is at these revisions, so the upgrade test builds one by running the migrations up
to them (``tests/core/test_upgrade.py``), writes data as that schema holds it, upgrades to today's heads and reads
the data back through the API. Why revisions and not the released package itself: a wheel of the release is not
in the repository (no package index holds it) and a store is what the release's migrations made it, so the
revisions are the exact description of what an upgrade meets; the migrations are append-only (a released one
is never edited, a fix is a new revision), which this relies on.

Releasing a version appends its heads here (``alembic heads`` at the release's commit) with its CHANGELOG section.
"""

from __future__ import annotations

RELEASED_HEADS: dict[str, tuple[str, ...]] = {
    # 0.1.0: the schema at the commit before the changelog opened [Unreleased] above [0.1.0] (f18124c^).
    "0.1.0": ("core_0003", "exchange_0001", "machines_0002", "interactions_0005", "batching_0001"),
}
"""Per released version, the migration heads of a store it wrote, oldest release first."""

__all__ = ["RELEASED_HEADS"]

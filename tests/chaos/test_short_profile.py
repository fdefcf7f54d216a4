"""The short chaos profile: three servers on one PostgreSQL, all four faces under load, a few faults of each
kind, then zero invariant violations. PostgreSQL only: many servers on one store is what it exercises."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import SHORT, describe, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


async def test_short_chaos_profile_keeps_every_invariant(tmp_path: Path) -> None:
    result = await run(SHORT, tmp_path / "chaos")
    summary = describe(result)
    print(summary)
    assert result.violations == [], summary
    assert result.faults.get("kill", 0) >= 2, summary
    # The nemesis draws faults at random; in 45 s every kind is likely but not certain, so ask for variety.
    assert len(set(result.faults) | set(result.skipped_faults)) >= 4, summary
    assert result.operation_count > 50, summary
    assert result.outstanding_after_drain == 0, summary

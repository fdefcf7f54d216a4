"""Keep a seeded random sample of a session's pending mutants; mark the others skipped (cosmic-ray has no sampler).

A whole module's mutants take hours on a shared machine; a uniform sample with a fixed seed is repeatable and
says what share of the operators a module's tests kill. Run with the mutation venv's python, after the
operator and pragma filters:

    .venv-mutation/bin/python mutation/sample.py SESSION N [DRAW]

Mutants already run are untouched; running it again on the same session keeps the same sample (the pending
mutants are those the sample kept).
"""

import random
import sys

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult


def sample(db: WorkDB, keep: int, seed: int) -> tuple[int, int]:
    pending = sorted(item.job_id for item in db.pending_work_items)
    kept = set(random.Random(seed).sample(pending, min(keep, len(pending))))
    skipped = WorkResult(output="not sampled", test_outcome=None, diff=None, worker_outcome=WorkerOutcome.SKIPPED)
    db.set_multiple_results([job_id for job_id in pending if job_id not in kept], skipped)
    return len(kept), len(pending)


if __name__ == "__main__":
    session, keep = sys.argv[1], int(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 37
    with use_db(session) as db:
        kept, pending = sample(db, keep, seed)
    print(f"sampled {kept} of {pending} pending mutants (seed {seed})")

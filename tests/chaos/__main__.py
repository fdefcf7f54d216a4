"""``python -m tests.chaos --minutes 30 --kills 200``: the long chaos profile, run by hand."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

from tests.chaos.harness import SHORT, WorkdirInUse, describe, long_profile, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0, help="how long faults are injected")
    parser.add_argument("--kills", type=int, default=200, help="at least this many server SIGKILLs")
    parser.add_argument("--short", action="store_true", help="run the short profile (as the test suite does)")
    parser.add_argument("--pg-restart", action="store_true",
                        help="also restart PostgreSQL now and then (needs MAINSPRING_CHAOS_PG_RESTART=1)")
    parser.add_argument("--pg-restart-every", type=int, default=40, metavar="N",
                        help="with --pg-restart: every N-th fault is a PostgreSQL restart")
    parser.add_argument("--pg-failover", action="store_true",
                        help="run on an HA PostgreSQL of the run's own (scripts/ha-postgres) and kill its primary now and then")
    parser.add_argument("--pg-failover-every", type=int, default=25, metavar="N",
                        help="with --pg-failover: every N-th fault kills the primary")
    parser.add_argument("--workdir", type=Path, default=None, help="where history, logs and result.json go")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("mainspring.chaos").setLevel(logging.INFO)
    # The protocol helper warns on every fault it rides out; the history has them all.
    logging.getLogger("mainspring.client.exchange").setLevel(logging.ERROR)
    profile = SHORT if args.short else long_profile(args.minutes, args.kills, args.pg_restart_every if args.pg_restart else 0,
                                                    args.pg_failover_every if args.pg_failover else 0)
    workdir = args.workdir or Path("chaos-runs") / time.strftime("%Y%m%d-%H%M%S")
    try:
        result = asyncio.run(run(profile, workdir.resolve()))
    except WorkdirInUse as refused:
        parser.error(str(refused))
    print(describe(result))
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())

"""The encoding of a lease's answer alone (50 items, in process, no store): through the declared models
(``InteractionList.model_validate`` then the operation's encoder) against ``web.routing.AsDeclared`` (the
items as ``service.to_api`` made them, sent with ``to_json``), asserting both give the same bytes.

    .venv/bin/python -m bench.answer_encode [--items 50] [--rounds 5]

Prints per way the process CPU per answer, least and median of the rounds.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from mainspring.interactions.models import InteractionList
from mainspring.web.routing import AsDeclared, answer_encoder

STAMP = "2026-11-29T10:00:00.000Z"
ITEM = {"id": "123", "queue": "bench", "parent_id": None, "name": None, "message_id": None, "channel": None, "user": None,
        "source": None, "priority": 0, "data": {"n": 1, "text": "x" * 100}, "result": None, "error": None, "error_detail": None,
        "status": "processing", "next_processing": STAMP, "attempts": 1, "created_at": STAMP, "updated_at": STAMP,
        "lease": {"token": "abcdef0123456789", "expires_at": STAMP}, "trace_parent": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--items", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    answer = {"interactions": [dict(ITEM, id=str(i)) for i in range(args.items)], "next_cursor": None}
    encode = answer_encoder(InteractionList)
    ways: dict[str, Callable[[], bytes]] = {
        "models": lambda: encode(InteractionList.model_validate(answer)),
        "AsDeclared": lambda: encode(AsDeclared(answer)),
    }
    assert ways["models"]() == ways["AsDeclared"](), "the two ways send different bytes"
    for name, way in ways.items():
        rounds = []
        for _ in range(args.rounds):
            started = time.process_time()
            for _ in range(1000):
                way()
            rounds.append((time.process_time() - started) / 1000 * 1e6)
        print(f"{name}: {min(rounds):.0f} µs least, {sorted(rounds)[len(rounds) // 2]:.0f} µs median per answer of {args.items} items")


if __name__ == "__main__":
    main()

"""An invoice machine: issued, paid in parts, overdue reminders.

Run in-process, from the repository root: ``mainspring serve --app examples.machines.invoices:app``; or as
an HTTP processor: ``python -m examples.machines.invoices --port 9000``, with the namespace's processor URL
set to ``http://127.0.0.1:9000/``.
"""

from __future__ import annotations

from typing import Any

from mainspring import App
from mainspring.machines.processor import Unprocessable

app = App()
DAY_MS = 86_400_000


@app.processor("invoices")
class Invoice:
    def init(self, args: Any, machine: Any) -> Any:
        if not isinstance(args, dict) or args.get("amount", 0) <= 0:
            raise Unprocessable("amount must be positive")
        return {
            "events": [{"issued": args}],
            "aux_state": {"due": args["amount"], "paid": 0},
            "action": {"timer": {"in_ms": 14 * DAY_MS}},
        }

    def call(self, args: Any, machine: Any) -> Any:
        state = machine["aux_state"]
        paid = state["paid"] + args["amount"]
        answer: dict[str, Any] = {"events": [{"paid": args["amount"]}], "aux_state": {**state, "paid": paid}, "response": {"paid": paid}}
        if paid >= state["due"]:
            answer["events"].append("settled")
            answer["action"] = {"timer": None}
        return answer

    def timeout(self, args: Any, machine: Any) -> Any:
        return {"events": ["overdue"], "action": {"timer": {"in_ms": DAY_MS}}}

    def notification(self, args: Any, machine: Any) -> Any:
        return {"events": [{"note": args}]}

    def repair(self, args: Any, machine: Any) -> Any:
        return {"events": [{"repaired": args}], "response": "ok"}


if __name__ == "__main__":
    import argparse

    from mainspring.machines.host import serve_processor

    parser = argparse.ArgumentParser(description="Serve the Invoice processor over HTTP.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    options = parser.parse_args()
    serve_processor(Invoice, host=options.host, port=options.port)

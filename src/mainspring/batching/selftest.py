"""``mainspring selftest``: the seed's integration scenarios against a live server.

Each scenario runs in its own batcher with a unique name (``selftest-<run>-<scenario>``), so real
traffic is never touched, and deletes it at the end of its run, passed or failed (``DELETE
/v1/batchers/{name}?force=true``), so test batchers do not pile up. It goes as deep as asked: ``accepted`` (the server took the tasks),
``packed`` (the dispatcher made the expected packages, and told the sender about a rejected task),
``claimed`` (a worker got each package, exactly once) and ``done`` (completing them finished every task).

Scenarios (from seed 003, with short timers):
- ``pair``: a pair of books (two languages) through the whole chain.
- ``overflow``: two pairs, then two more near the end of the timer → six at once, the last pair later.
- ``odd``: a pair, then a third, odd task near the end of the timer → the pair packed, the odd one
  rejected ``incomplete_group`` and its sender told (status and event).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, TypedDict, TypeVar, cast

import httpx
import typer
from rich.console import Console
from rich.table import Table

from mainspring.client.batching import BatchingClient, BatchingError
from mainspring.client.models import Task
from mainspring.core.cli import working
from mainspring.types import JsonObject

T = TypeVar("T")


class _State(TypedDict, total=False):
    """What one scenario's steps hand on to the next."""

    ids: list[str]
    package: str
    tokens: dict[str, str]
    six: list[str]
    last: list[str]
    packages: list[str]

DEPTHS = ("accepted", "packed", "claimed", "done")
SCENARIOS = ("pair", "overflow", "odd")



class StepFailed(Exception):
    pass


@dataclass
class Outcome:
    scenario: str
    results: dict[str, tuple[bool, str]] = field(default_factory=dict)
    batcher: str = ""
    cleanup: str = "not run"
    """What became of the scenario's batcher: removed, never created, or why it was left."""

    @property
    def passed(self) -> bool:
        return all(ok for ok, _ in self.results.values())


class Scenario:
    """One run in an isolated batcher; ``depth`` tells how far to go."""

    def __init__(self, client: BatchingClient, run_id: str, name: str, linger_ms: int) -> None:
        self.client = client
        self.name = name
        self.batcher = f"selftest-{run_id}-{name}"
        self.linger_ms = linger_ms
        self.worker = f"selftest-{run_id}"
        self.answered_at = 0.0
        self.slowest = 0.0

    def sleep_until_near_the_timer_end(self, tasks_to_come: int) -> None:
        """Sleep until shortly before the running timer ends, leaving room for ``tasks_to_come`` submits.

        The timer started when the server stored the second task, just before its answer arrived here.
        """
        ends = self.answered_at + self.linger_ms / 1000
        room = max(0.15 * self.linger_ms / 1000, (tasks_to_come + 2) * self.slowest)
        if room >= self.linger_ms / 1000:
            raise StepFailed(f"the server answers too slowly ({self.slowest * 1000:.0f} ms) for --linger-ms {self.linger_ms}")
        time.sleep(max(0.0, ends - room - time.monotonic()))

    def setup(self) -> None:
        self.client.put_batcher(
            self.batcher, min_size=2, max_size=6, linger_ms=self.linger_ms, max_wait_ms=self.linger_ms * 10,
            group_size=2, incomplete_group="reject", lease_ms=60_000,
        )

    def submit_pair(self, book: str) -> list[str]:
        ids = []
        for member in ("en", "ru"):
            task_id = f"book-{book}-{member}"
            started = time.monotonic()
            task = self.client.submit(
                self.batcher, id=task_id, group=f"book-{book}", member=member,
                content=f"selftest {self.batcher} book {book} in {member}",
            )
            self.answered_at = time.monotonic()
            self.slowest = max(self.slowest, self.answered_at - started)
            if task["status"] != "pending":
                raise StepFailed(f"{task_id} was not accepted: {task['status']} {task['reason']}")
            ids.append(task_id)
        return ids

    def wait_for(self, what: str, check: Callable[[], T | None], within_ms: int) -> T:
        deadline = time.monotonic() + within_ms / 1000
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise StepFailed(f"timed out waiting for {what}")
            time.sleep(0.05)

    def statuses(self, ids: list[str]) -> dict[str, Task]:
        return {i: self.client.task(self.batcher, i) for i in ids}

    def packed_into(self, ids: list[str]) -> str | None:
        """The one package all of ``ids`` are in, once they are packed."""
        tasks = self.statuses(ids)
        if any(t["status"] == "pending" for t in tasks.values()):
            return None
        packages = {t["package_id"] for t in tasks.values()}
        if None in packages or len(packages) != 1:
            raise StepFailed(f"expected {ids} in one package, got {[(i, t['status'], t['package_id']) for i, t in tasks.items()]}")
        return packages.pop()

    def claim_expected(self, package_ids: list[str]) -> dict[str, str]:
        """Claim until every expected package is held; answers package id → lease token."""
        tokens: dict[str, str] = {}
        for _ in package_ids:
            package = self.client.claim(self.batcher, self.worker, wait_ms=2_000)
            if package is None:
                raise StepFailed("the cafe had no package to claim")
            if package["id"] not in package_ids or package["id"] in tokens:
                raise StepFailed(f"claimed unexpected package {package['id']}")
            tokens[package["id"]] = package["lease"]["token"]
        if self.client.claim(self.batcher, self.worker, wait_ms=0) is not None:
            raise StepFailed("a package was claimable twice or an extra package exists")
        for package_id in package_ids:
            tasks = self.client.package(package_id)["tasks"]
            if any(t["status"] != "claimed" for t in tasks):
                raise StepFailed(f"tasks of {package_id} are not all claimed")
        return tokens

    def complete_all(self, tokens: dict[str, str], ids: list[str]) -> None:
        for package_id, token in tokens.items():
            self.client.complete(package_id, token)
        tasks = self.statuses(ids)
        not_done = [i for i, t in tasks.items() if t["status"] != "done"]
        if not_done:
            raise StepFailed(f"tasks not done after completing: {not_done}")

    def rejection_event_seen(self, task_id: str) -> str:
        subject = f"{self.batcher}/{task_id}"
        after: str | None = None
        try:
            for _ in range(200):
                page = self.client.events(after=after, types="batch.task.rejected")
                for event in page["events"]:
                    if event["subject"]["id"] == subject and cast(JsonObject, event["data"]).get("reason") == "incomplete_group":
                        return "event seen"
                if not page["events"]:
                    break
                after = page["next_cursor"]
        except BatchingError as exc:
            if exc.status == 403:
                return "event not checked (token may not read events)"
            raise
        raise StepFailed(f"no batch.task.rejected event for {task_id}")

    # --- the scenarios -------------------------------------------------------------------------------

    def run(self, depth: str) -> Outcome:
        outcome = Outcome(self.name, batcher=self.batcher)
        try:
            self.run_steps(depth, outcome)
        finally:
            outcome.cleanup = self.remove_batcher()
        return outcome

    def run_steps(self, depth: str, outcome: Outcome) -> None:
        steps = getattr(self, f"steps_{self.name}")()
        wanted = DEPTHS[: DEPTHS.index(depth) + 1]
        failed = False
        for level in wanted:
            if failed:
                outcome.results[level] = (False, "not reached")
                continue
            try:
                outcome.results[level] = (True, steps[level]() or "ok")
            except (StepFailed, BatchingError) as exc:
                outcome.results[level] = (False, str(exc))
                failed = True
            except httpx.HTTPError as exc:
                outcome.results[level] = (False, f"server unreachable: {exc}")
                failed = True

    def remove_batcher(self) -> str:
        """Delete the scenario's batcher, whatever the scenario left in it (a shallow depth leaves packages
        claimed: ``force``). Never raises: a failed cleanup is reported, not a failed scenario."""
        try:
            self.client.delete_batcher(self.batcher, force=True)
        except BatchingError as exc:
            if exc.status == 404:
                return "never created"
            return f"left in place: {exc}"
        except httpx.HTTPError as exc:
            return f"left in place: server unreachable ({exc})"
        return "removed"

    def steps_pair(self) -> dict[str, Callable[[], str | None]]:
        state: _State = {}

        def accepted() -> str:
            self.setup()
            state["ids"] = self.submit_pair("1")
            return "2 tasks pending"

        def packed() -> str:
            state["package"] = self.wait_for("the pair to be packed", lambda: self.packed_into(state["ids"]), self.linger_ms * 3 + 2000)
            return f"one package {state['package']}"

        def claimed() -> str:
            state["tokens"] = self.claim_expected([state["package"]])
            return "claimed once; the cafe is empty"

        def done() -> None:
            self.complete_all(state["tokens"], state["ids"])

        return {"accepted": accepted, "packed": packed, "claimed": claimed, "done": done}

    def steps_overflow(self) -> dict[str, Callable[[], str | None]]:
        state: _State = {}

        def accepted() -> str:
            self.setup()
            first = self.submit_pair("1")
            timer_started = self.answered_at  # the first pair reached min_size
            first += self.submit_pair("2")
            self.answered_at = timer_started
            self.sleep_until_near_the_timer_end(4)
            later = self.submit_pair("3") + self.submit_pair("4")
            state["six"], state["last"] = first + later[:2], later[2:]
            return "8 tasks pending"

        def packed() -> str:
            six = self.wait_for("six tasks packed at once", lambda: self.packed_into(state["six"]), self.linger_ms // 2 + 1000)
            if self.client.task(self.batcher, state["last"][0])["status"] != "pending":
                raise StepFailed("the fourth pair did not wait for its own timer")
            last = self.wait_for("the fourth pair packed", lambda: self.packed_into(state["last"]), self.linger_ms * 3 + 2000)
            state["packages"] = [six, last]
            return "6 at once, then the last pair after its timer"

        def claimed() -> str:
            state["tokens"] = self.claim_expected(state["packages"])
            return "each package claimed once"

        def done() -> None:
            self.complete_all(state["tokens"], state["six"] + state["last"])

        return {"accepted": accepted, "packed": packed, "claimed": claimed, "done": done}

    def steps_odd(self) -> dict[str, Callable[[], str | None]]:
        state: _State = {}

        def accepted() -> str:
            self.setup()
            state["ids"] = self.submit_pair("1")
            self.sleep_until_near_the_timer_end(1)
            odd = self.client.submit(self.batcher, id="book-2-en", group="book-2", member="en", content=f"selftest {self.batcher} odd")
            if odd["status"] != "pending":
                raise StepFailed(f"the odd task was not accepted: {odd['status']}")
            return "3 tasks pending"

        def packed() -> str:
            state["package"] = self.wait_for("the pair to be packed", lambda: self.packed_into(state["ids"]), self.linger_ms * 3 + 2000)
            odd = self.wait_for(
                "the odd task to be rejected",
                lambda: (t := self.client.task(self.batcher, "book-2-en"))["status"] != "pending" and t,
                2000,
            )
            if (odd["status"], odd["reason"]) != ("rejected", "incomplete_group"):
                raise StepFailed(f"odd task ended {odd['status']} {odd['reason']}, not rejected incomplete_group")
            return "pair packed; odd rejected incomplete_group, " + self.rejection_event_seen("book-2-en")

        def claimed() -> str:
            state["tokens"] = self.claim_expected([state["package"]])
            return "claimed once"

        def done() -> None:
            self.complete_all(state["tokens"], state["ids"])

        return {"accepted": accepted, "packed": packed, "claimed": claimed, "done": done}


def run_selftest(url: str, token: str | None, depth: str, linger_ms: int, scenarios: list[str]) -> list[Outcome]:
    run_id = uuid.uuid4().hex[:8]
    outcomes = []
    with BatchingClient(url, token=token) as client:
        for name in scenarios:
            with working(f"selftest: scenario {name}…"):
                outcomes.append(Scenario(client, run_id, name, linger_ms).run(depth))
    return outcomes


def report(outcomes: list[Outcome], depth: str, console: Console) -> None:
    wanted = DEPTHS[: DEPTHS.index(depth) + 1]
    table = Table("scenario", *wanted, title="mainspring selftest (batching)")
    for outcome in outcomes:
        cells = []
        for level in wanted:
            ok, detail = outcome.results.get(level, (False, "not run"))
            cells.append(f"[green]PASS[/green] {detail}" if ok else f"[red]FAIL[/red] {detail}")
        table.add_row(outcome.scenario, *cells)
    console.print(table)
    for outcome in outcomes:
        if outcome.cleanup == "removed":
            console.print(f"removed batcher {outcome.batcher}")
        else:
            console.print(f"batcher {outcome.batcher}: {outcome.cleanup}")


def selftest(
    url: Annotated[str, typer.Option(help="The server to test.", envvar="MAINSPRING_URL")] = "http://127.0.0.1:8080",
    depth: Annotated[str, typer.Option(help="How deep: accepted, packed, claimed or done.")] = "done",
    token: Annotated[str | None, typer.Option(help="Bearer token with scope batchers:selftest-*.", envvar="MAINSPRING_TOKEN")] = None,
    linger_ms: Annotated[int, typer.Option(help="The timer of the test batchers.", min=200)] = 2000,
    scenario: Annotated[list[str] | None, typer.Option(help="Run only these scenarios (pair, overflow, odd).")] = None,
) -> None:
    """Run three end-to-end batching scenarios (pair, overflow, odd) against a running server, each in a batcher of its own that is deleted afterwards, and print a pass/fail table (exit 1 on any failure)."""
    if depth not in DEPTHS:
        raise typer.BadParameter(f"depth must be one of {', '.join(DEPTHS)}", param_hint="--depth")
    chosen = scenario or list(SCENARIOS)
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        raise typer.BadParameter(f"unknown scenario(s) {unknown}", param_hint="--scenario")
    console = Console()
    outcomes = run_selftest(url, token, depth, linger_ms, chosen)
    report(outcomes, depth, console)
    if not all(o.passed for o in outcomes):
        raise typer.Exit(1)


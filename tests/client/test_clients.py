"""The Python clients: generated sync twins, explicit typed methods, one error hierarchy, one retry policy."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any

import httpx
import pytest

import mainspring
from mainspring.client import (
    ApiError,
    AsyncBatchingClient,
    AsyncEventsClient,
    AsyncExchangeClient,
    AsyncInteractionsClient,
    AsyncMachinesClient,
    BatchingClient,
    Conflict,
    EventsClient,
    ExchangeClient,
    InteractionsClient,
    InvalidURL,
    LeaseLost,
    MachinesClient,
    NotFound,
    ServiceUnavailable,
)
from mainspring.core import errors as server_errors
from tests.docs.harness import ROOT

PAIRS = [(AsyncInteractionsClient, InteractionsClient), (AsyncBatchingClient, BatchingClient),
         (AsyncMachinesClient, MachinesClient), (AsyncExchangeClient, ExchangeClient), (AsyncEventsClient, EventsClient)]


def test_the_sync_clients_are_generated_from_the_async_ones_and_up_to_date() -> None:
    done = subprocess.run([sys.executable, "scripts/sync_clients.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(("async_client", "sync_client"), PAIRS, ids=lambda c: c.__name__)
def test_every_client_method_is_explicit_typed_documented_and_the_same_sync_and_async(async_client: type, sync_client: type) -> None:
    public = {n for n in dir(async_client) if not n.startswith("_")} - {"aclose", "policy", "base_url"}
    assert public == {n for n in dir(sync_client) if not n.startswith("_")} - {"close", "policy", "base_url"}
    assert "__getattr__" not in vars(async_client) and "__getattr__" not in vars(sync_client)
    for name in public:
        for client in (async_client, sync_client):
            method = getattr(client, name)
            assert method.__doc__ and method.__doc__.strip(), f"{client.__name__}.{name} has no docstring"
            signature = inspect.signature(method)
            assert signature.return_annotation is not inspect.Signature.empty, f"{client.__name__}.{name}"
            assert all(p.annotation is not inspect.Parameter.empty for p in list(signature.parameters.values())[1:]), f"{client.__name__}.{name}"
        assert list(inspect.signature(getattr(async_client, name)).parameters) == list(inspect.signature(getattr(sync_client, name)).parameters)


def test_a_typo_in_a_method_name_is_an_attribute_error_that_names_it() -> None:
    with InteractionsClient("http://127.0.0.1:9") as client, pytest.raises(AttributeError, match="creat"):
        client.creat("q")  # type: ignore[attr-defined]


def test_a_server_url_without_a_scheme_is_an_invalid_url_error() -> None:
    with pytest.raises(InvalidURL) as refused:
        InteractionsClient("localhost:8080")
    assert refused.value.code == "invalid_url" and isinstance(refused.value, mainspring.MainspringError)


async def test_a_problem_answer_raises_a_mainspring_error_with_code_status_and_detail(app: Any) -> None:
    async with AsyncInteractionsClient("http://mainspring.test", transport=httpx.ASGITransport(app=app)) as client:
        with pytest.raises(NotFound) as missing:
            await client.get("424242")
        error = missing.value
        assert isinstance(error, mainspring.MainspringError) and isinstance(error, server_errors.NotFound)
        assert (error.status, error.code) == (404, "interaction_not_found")
        assert error.detail and error.problem()["code"] == "interaction_not_found"
        item = await client.create("q", {"n": 1})
        await client.complete(item["id"], {"ok": True})
        with pytest.raises(Conflict) as finished:
            await client.fail(item["id"], "too late")
        assert finished.value.code == "interaction_finished"
        await client.create("q", {"n": 2})
        [held] = (await client.lease("q", "w1"))["interactions"]
        await client.release(held["id"], held["lease"]["token"], {"complete": {}})
        with pytest.raises(LeaseLost):
            await client.heartbeat(held["id"], held["lease"]["token"])


class Flaky(httpx.MockTransport):
    """Fails the first ``failures`` requests with ``error`` (or answers ``status``), then answers 200."""

    def __init__(self, failures: int, error: type[httpx.TransportError] | None = None, status: int = 503) -> None:
        self.calls = 0

        def handle(request: httpx.Request) -> httpx.Response:
            self.calls += 1
            if self.calls <= failures:
                if error is not None:
                    raise error("down", request=request)
                return httpx.Response(status, json={"code": "unavailable", "status": status, "detail": "store restarting"})
            return httpx.Response(200, json={"id": "1", "status": "ready", "interactions": []})

        super().__init__(handle)


def test_a_safe_call_is_retried_while_the_server_cannot_be_reached() -> None:
    transport = Flaky(2, httpx.ReadError)
    with InteractionsClient("http://mainspring.test", transport=transport, attempts=3, max_wait=0.001) as client:
        assert client.get("1")["status"] == "ready"
    assert transport.calls == 3


def test_an_unsafe_call_is_not_repeated_once_it_may_have_reached_the_server() -> None:
    transport = Flaky(1, httpx.ReadError)
    with InteractionsClient("http://mainspring.test", transport=transport, attempts=3, max_wait=0.001) as client:
        with pytest.raises(ServiceUnavailable) as lost:
            client.lease("q", "w1")
    assert transport.calls == 1 and lost.value.sent is True
    assert isinstance(lost.value.__cause__, httpx.ReadError)


def test_an_unsafe_call_refused_a_connection_is_sent_again_since_it_never_left() -> None:
    transport = Flaky(1, httpx.ConnectError)
    with InteractionsClient("http://mainspring.test", transport=transport, attempts=3, max_wait=0.001) as client:
        client.lease("q", "w1")
    assert transport.calls == 2


def test_503_answers_are_retried_for_safe_calls_and_raised_as_service_unavailable_when_spent() -> None:
    transport = Flaky(10)
    with BatchingClient("http://mainspring.test", transport=transport, attempts=3, max_wait=0.001) as client:
        with pytest.raises(ServiceUnavailable) as spent:
            client.task("books", "t1")
    assert transport.calls == 3 and spent.value.status == 503 and spent.value.code == "unavailable"
    unsafe = Flaky(10)
    with BatchingClient("http://mainspring.test", transport=unsafe, attempts=3, max_wait=0.001) as client:
        with pytest.raises(ServiceUnavailable):
            client.claim("books", "w1")
    assert unsafe.calls == 1


async def test_an_async_call_is_sent_as_many_times_as_the_policy_allows_its_first_attempt_included() -> None:
    # The first attempt is made outside the retry loop, which then decides on its error as it always did.
    for attempts, failures, calls in ((3, 1, 2), (3, 5, 3), (1, 5, 1)):
        transport = Flaky(failures)
        async with AsyncExchangeClient("http://mainspring.test", transport=transport, attempts=attempts, max_wait=0.001) as client:
            if failures < attempts:
                assert (await client.process("p1"))["id"] == "1"
            else:
                with pytest.raises(ServiceUnavailable) as spent:
                    await client.process("p1")
                assert spent.value.status == 503
        assert transport.calls == calls, (attempts, failures)
    unsafe = Flaky(1, httpx.ReadError)
    async with AsyncExchangeClient("http://mainspring.test", transport=unsafe, attempts=3, max_wait=0.001) as client:
        with pytest.raises(ServiceUnavailable) as lost:
            await client.start("mobile-a", "db-1", "g", ["m1"])
    assert unsafe.calls == 1 and lost.value.sent is True


def test_the_old_per_face_error_names_still_catch_the_shared_errors() -> None:
    from mainspring.client.batching import BatchingError
    from mainspring.client.exchange import ExchangeError, Unavailable
    from mainspring.client.interactions import InteractionsError
    from mainspring.client.machines import MachinesError

    assert BatchingError is ExchangeError is InteractionsError is MachinesError is ApiError
    assert Unavailable is ServiceUnavailable


async def retried_setup(client: AsyncInteractionsClient) -> dict[str, Any]:
    await client.put_queue("q", max_attempts=1)
    item = await client.create("q", {"n": 1})
    await client.fail(item["id"], "smtp said no")
    return dict(item)


async def test_retry_makes_a_failed_interaction_due_again_with_attempts_reset(app: Any) -> None:
    async with AsyncInteractionsClient("http://mainspring.test", transport=httpx.ASGITransport(app=app)) as client:
        item = await retried_setup(client)
        again = await client.retry(item["id"])
        assert (again["status"], again["attempts"]) == ("ready", 0)
        later = await client.create("q", {"n": 2})
        await client.cancel(later["id"])
        assert (await client.retry(later["id"], process_in_ms=60_000))["status"] == "scheduled"
        with pytest.raises(Conflict) as unfinished:
            await client.retry(item["id"])
        assert unfinished.value.code == "interaction_not_finished"
        done = await client.create("q", {"n": 3}, completed=True)
        with pytest.raises(Conflict) as completed:
            await client.retry(done["id"])
        assert completed.value.code == "interaction_finished"

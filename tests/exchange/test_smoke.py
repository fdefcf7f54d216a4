from tests.exchange.conftest import MAILBOX, listed, process, put, start


async def test_full_cycle_smoke(client):
    m = await put(client, b"one", **{"Message-Id": "k1"})
    assert (await listed(client))["messages"][0]["id"] == m["id"]
    r = await start(client, [m["id"]])
    assert r.status_code == 201, r.text
    pid = r.json()["id"]
    r = await client.post(f"/v1/exchange/processes/{pid}/ready", json={"replies": [{"addressee": "mobile-a", "database": "db-2", "body": "answer"}]})
    assert r.status_code == 200, r.text
    r = await client.post(f"/v1/exchange/processes/{pid}/committed")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "DONE"
    assert (await listed(client, "/v1/exchange/mailboxes/mobile-a/db-2"))["messages"][0]["size"] == 6
    assert (await process(client, pid))["state"] == "DONE"
    assert (await client.get(f"{MAILBOX}/messages/{m['id']}")).status_code == 404

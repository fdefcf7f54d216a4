from tests.batching.conftest import claim, put_batcher, submit_pair, wait_status


async def test_a_pair_goes_pending_packed_claimed_done(client, clock) -> None:
    await put_batcher(client)
    ids = await submit_pair(client, "79")
    clock.advance(5000)
    tasks = await wait_status(client, ids, "packed")
    package = await claim(client)
    assert package and {t["id"] for t in package["tasks"]} == set(ids)
    assert tasks[0]["package_id"] == package["id"]
    r = await client.post(f"/v1/packages/{package['id']}/complete", json={"token": package["lease"]["token"]})
    assert r.status_code == 200, r.text
    await wait_status(client, ids, "done")

"""The weight routes answer within the rollout service's OpenAPI spec: every status they return is declared
for the route, with a body that validates against the schema declared for it (a real replica with its
sidecar and a real publisher; the in-process contract test of the other routes cannot run a sidecar)."""

from __future__ import annotations

import httpx
import jsonschema

from services.learner.weights import WeightPublisher
from shared import keys
from shared.weight_sync import WeightSyncSettings
from tests.weight_sync.conftest import TOKEN, new_weights, wait_ready, wait_registered

AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAST = {"init_timeout_s": 20, "collective_timeout_s": 10, "regroup_timeout_s": 5, "load_timeout_s": 20}


def conforms(spec: dict, path: str, method: str, r: httpx.Response) -> int:
    """Assert ``r`` is a response ``spec`` declares for the operation; returns its status."""
    declared = spec["paths"][path][method]["responses"]
    assert str(r.status_code) in declared, (method, path, r.status_code, sorted(declared), r.text)
    schema = declared[str(r.status_code)]["content"]["application/json"]["schema"]
    assert r.headers["content-type"].startswith("application/json"), r.headers
    jsonschema.Draft202012Validator({**schema, "components": spec["components"]}).validate(r.json())
    return r.status_code


async def test_weight_routes_answer_within_their_spec(replicas, redis_client, tiny_model_dir):
    run = "contract"
    # the routes, with and without a sidecar (started side by side)
    on, off = replicas(run, wait=False), replicas(f"{run}-off", enabled="false")
    await wait_ready(on)
    await wait_registered(redis_client, run, 1)
    async with httpx.AsyncClient(base_url=on.url, timeout=30) as client:
        spec = (await client.get("/openapi.json")).json()
        assert {"/weights/version", "/weights/update"} <= set(spec["paths"])
        seen: dict[str, set[int]] = {"/weights/version": set(), "/weights/update": set()}

        async def call(method: str, path: str, base: str = on.url, **kwargs) -> httpx.Response:
            r = await client.request(method, f"{base}{path}", **kwargs)
            seen[path].add(conforms(spec, path, method.lower(), r))
            return r

        await call("GET", "/weights/version")                                   # no token: 401
        await call("GET", "/weights/version", headers={"Authorization": "Bearer wrong"})
        status = (await call("GET", "/weights/version", headers=AUTH)).json()
        assert status["weight_version"] == 0 and status["latest_version"] == 0 and status["last_update"] is None
        await call("GET", "/weights/version", base=off.url, headers=AUTH)       # no sidecar: 503
        for body in ({"version": 0}, {"version": "1"}, {"timeout_s": -1}, {"extra": 1}):
            assert (await call("POST", "/weights/update", headers=AUTH, json=body)).status_code == 400, body
        assert (await call("POST", "/weights/update", headers=AUTH, json={})).status_code == 409  # none yet

        async with WeightPublisher(redis_client, run, WeightSyncSettings(bucket_bytes=64 << 10, **FAST)) as pub:
            assert await pub.publish(new_weights(tiny_model_dir)) == 1
        r = await call("POST", "/weights/update", headers=AUTH, json={"version": 1})
        assert r.json() == {"success": True, "weight_version": 1}
        last = (await call("GET", "/weights/version", headers=AUTH)).json()["last_update"]
        assert last["version"] == 1 and last["state"] == "loaded" and last["source"] == "collective"
        assert (await call("POST", "/weights/update", headers=AUTH, json={"version": 5})).status_code == 409

        # a latest version no publisher serves: the replica cannot reach it in the time asked for
        await redis_client.set(keys.weights_version(run), "7")
        r = await call("POST", "/weights/update", headers=AUTH, json={"timeout_s": 0.5})
        assert r.status_code == 504 and "still at version 1" in r.json()["error"]["message"]
    assert seen == {"/weights/version": {200, 401, 503}, "/weights/update": {200, 400, 409, 504}}

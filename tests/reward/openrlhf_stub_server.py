"""A stand-in for OpenRLHF's ``serve_rm`` (same /get_reward shape), run as its own process in tests.

reward = number of "good" in the query, minus the number of "bad". ``POST /control`` sets a delay
(to simulate a slow model) and counts calls, so tests can drive timeouts and recovery.

    python -m tests.reward.openrlhf_stub_server --port 5000
"""

from __future__ import annotations

import argparse
import asyncio

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

app = FastAPI()
state = {"delay_s": 0.0, "delay_calls": 0, "calls": 0, "last": None}


@app.post("/get_reward")
async def get_reward(request: Request):
    data = await request.json()
    queries = data.get("query")
    state["calls"] += 1
    state["last"] = data
    if state["delay_calls"] != 0:
        state["delay_calls"] -= 1
        await asyncio.sleep(state["delay_s"])
    rewards = [float(q.count("good") - q.count("bad")) for q in queries]
    return JSONResponse({"rewards": rewards, "scores": rewards, "extra_logs": {"dummy_scores": rewards}})


@app.post("/control")
async def control(request: Request):
    """{"delay_s": float, "delay_calls": int (-1 = every call)}; returns the call count and last request."""
    data = await request.json()
    state.update({k: data[k] for k in ("delay_s", "delay_calls") if k in data})
    return {"calls": state["calls"], "last": state["last"]}


@app.get("/health")
async def health():
    return {"ok": True}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")

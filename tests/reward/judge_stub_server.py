"""A scripted stand-in for an LLM judge: an OpenAI-compatible ``POST /v1/chat/completions``.

Its judgment is rule-based so tests know the right answer: a response's score is how often it says "good"
(at most 10). What it judges is found in the user message by the tags the tests' templates use: one
``<response>...</response>`` (pointwise), ``<response id="k">`` blocks (group mode, as the scorer writes
``{responses}``), or ``<a>...</a>`` and ``<b>...</b>`` (pairwise). ``POST /control`` scripts it: the reply's
``format`` (number, json, boxed, ranking, labels, garbage), ``garbage_calls`` (the next N replies are
unreadable), ``fail_calls`` + ``fail_status`` (the next N calls answer that status), ``delay_s`` (each call
sleeps), and it reports ``calls``, ``max_in_flight``, ``in_flight`` and the last requests.

    python -m tests.reward.judge_stub_server --port 5001        # or serve ``app`` in a thread
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

app = FastAPI()
DEFAULTS = {"format": "number", "garbage_calls": 0, "fail_calls": 0, "fail_status": 500, "delay_s": 0.0}
state: dict = {**DEFAULTS, "calls": 0, "in_flight": 0, "max_in_flight": 0, "requests": [], "generation": 0}

_GROUP = re.compile(r'<response id="(\d+)">\n(.*?)\n</response>', re.DOTALL)


def goods(text: str) -> int:
    return min(10, text.count("good"))


def judge(content: str, fmt: str) -> str:
    group = _GROUP.findall(content)
    if group:
        scores = [goods(r) for _, r in group]
        if fmt == "ranking":
            order = sorted(range(1, len(scores) + 1), key=lambda k: (-scores[k - 1], k))
            return json.dumps({"ranking": order})
        if fmt == "json":
            return "Here you go:\n```json\n" + json.dumps({"scores": scores}) + "\n```"
        if fmt == "boxed":
            return "Scores: \\boxed{" + ", ".join(map(str, scores)) + "}"
        return "\n".join(f"Response {k}: {s}" for k, s in enumerate(scores, start=1))
    if "<a>" in content:
        a = goods(content.split("<a>", 1)[1].rsplit("</a>", 1)[0])
        b = goods(content.split("<b>", 1)[1].rsplit("</b>", 1)[0])
        return "Verdict: " + ("A" if a > b else "B" if b > a else "tie")
    start, end = content.find("<response>"), content.rfind("</response>")
    score = goods(content[start + len("<response>"):end])
    return {"number": f"The answer is fine, 3 points for style. Score: {score}",
            "json": f'I rate it so: {{"score": {score}, "why": "counted"}}',
            "boxed": f"\\boxed{{{score}}}"}.get(fmt, f"Score: {score}")


@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.json()
    state["calls"] += 1
    state["requests"] = [*state["requests"][-49:], body]
    generation = state["generation"]  # a call still running from before a reset is not counted after it
    state["in_flight"] += 1
    state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
    try:
        await asyncio.sleep(state["delay_s"])
    finally:
        if generation == state["generation"]:
            state["in_flight"] -= 1
    if state["fail_calls"] > 0:
        state["fail_calls"] -= 1
        return JSONResponse({"error": {"message": "scripted failure"}}, status_code=state["fail_status"])
    content = body["messages"][-1]["content"]
    if state["garbage_calls"] > 0 or state["format"] == "garbage":
        state["garbage_calls"] = max(0, state["garbage_calls"] - 1)
        text = "I cannot decide, both have merit."
    else:
        text = judge(content, state["format"])
    return {"id": "x", "object": "chat.completion", "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}


@app.post("/control")
async def control(request: Request):
    """Set any of DEFAULTS' keys (``reset: true`` first restores them and zeroes the counters)."""
    data = await request.json()
    if data.get("reset"):
        state.update({**DEFAULTS, "calls": 0, "in_flight": 0, "max_in_flight": 0, "requests": [],
                      "generation": state["generation"] + 1})
    state.update({k: data[k] for k in DEFAULTS if k in data})
    return {k: state[k] for k in ("calls", "in_flight", "max_in_flight", "requests")}


@app.get("/health")
async def health():
    return {"ok": True}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", backlog=1024)

"""Per-turn overhead of session recording in the OpenAI path, vs plain ``/v1/chat/completions`` (target <= 5 %).

One run, one rollout service process (hf engine, tiny model, session mode on, a private Redis). Each round runs
the same multi-turn chat twice, turn by turn in lockstep (turn k of one mode right after turn k of the other, the
order alternating, so that the load of a shared machine hits both alike): plainly (``/v1/chat/completions``, the
whole conversation rendered every turn) and in a session (``/sessions/{id}/v1/chat/completions``: the turn
recorded, its prompt continued from the previous exact ids; then ``finish`` pushes the experience to Redis). Every turn generates
exactly ``--new-tokens`` tokens (``ignore_eos``). Reported: the median latency of a turn in each mode, the
overhead per turn (ms) and the ratio, and the finish (reward + push to Redis) per session, also amortised per turn.

    .venv/bin/python benchmarks/session_overhead.py [--rounds 20] [--turns 3] [--new-tokens 16]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.local.tiny_model import build_tiny_causal_lm
from shared.ports import free_port
from shared.redis_server import EmbeddedRedis
from tests.procs import spawn, stop, wait_http_ok

TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
USER_TURNS = ["What is 17 * 23? Think step by step.", "Are you sure? Check it again.", "Now add 100 to it.",
              "And divide by two.", "Summarise the steps."]


class Conversation:
    """One chat against ``path``, a turn at a time."""

    def __init__(self, http: httpx.Client, path: str, new_tokens: int) -> None:
        self.http, self.path, self.new_tokens = http, path, new_tokens
        self.messages = [{"role": "system", "content": "You are a careful calculator."}]

    def turn(self, k: int) -> float:
        """Turn ``k``; its latency (s)."""
        self.messages.append({"role": "user", "content": USER_TURNS[k % len(USER_TURNS)]})
        t0 = time.perf_counter()
        r = self.http.post(self.path, json={"model": "tiny", "messages": self.messages, "max_tokens": self.new_tokens,
                                            "temperature": 1.0, "ignore_eos": True, "logprobs": True})
        took = time.perf_counter() - t0
        r.raise_for_status()
        self.messages.append(r.json()["choices"][0]["message"])
        return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleetrl-session-bench-"))
    model = build_tiny_causal_lm(tmp / "model")
    redis = EmbeddedRedis(data_dir=tmp / "redis")
    redis.start()
    port = free_port()
    cfg = tmp / "rollout.yaml"
    cfg.write_text(yaml.safe_dump({
        "port": port, "model": str(model), "served_model_name": "tiny", "control_token": TOKEN,
        "redis_url": redis.url, "run_name": "bench", "run_key": secrets.token_hex(32),  # sessions sign experiences
        "engine": {"kind": "hf", "device": "cpu", "max_batch_size": 8, "max_wait_ms": 1, "torch_threads": args.threads},
        "sessions": {"enabled": True}, "run": {"max_experience_backlog": 100000},
    }))
    log = tmp / "rollout.log"
    proc = spawn(["-m", "services.rollout", "--config", str(cfg)], log,
                 env={"OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"})
    url = f"http://127.0.0.1:{port}"
    plain: list[float] = []
    session: list[float] = []
    finishes: list[float] = []
    try:
        wait_http_ok(f"{url}/health", proc, timeout=120, log=log)
        with httpx.Client(base_url=url, timeout=120, headers=AUTH) as http:  # session calls need it too
            warm = Conversation(http, "/v1/chat/completions", args.new_tokens)
            for k in range(args.turns):
                warm.turn(k)
            for i in range(args.rounds):
                sid = http.post("/sessions", json={"prompt_id": f"bench-{i}"}, headers=AUTH).json()["session_id"]
                convs = {"plain": Conversation(http, "/v1/chat/completions", args.new_tokens),
                         "session": Conversation(http, f"/sessions/{sid}/v1/chat/completions", args.new_tokens)}
                for k in range(args.turns):  # the two modes' turn k back to back, in alternating order
                    order = ("plain", "session") if (i + k) % 2 == 0 else ("session", "plain")
                    took = {mode: convs[mode].turn(k) for mode in order}
                    plain.append(took["plain"])
                    session.append(took["session"])
                t0 = time.perf_counter()
                http.post(f"/sessions/{sid}/finish", json={"reward": 1.0}, headers=AUTH).raise_for_status()
                finishes.append(time.perf_counter() - t0)
    finally:
        stop(proc)
        redis.stop()
    p, s, f = (statistics.median(x) * 1000 for x in (plain, session, finishes))
    print(f"turns per mode: {len(plain)} ({args.rounds} rounds x {args.turns} turns, {args.new_tokens} new tokens each)")
    print(f"plain   /v1/chat/completions          median {p:8.2f} ms/turn")
    print(f"session /sessions/{{id}}/v1/chat/...    median {s:8.2f} ms/turn")
    d = statistics.median(b - a for a, b in zip(plain, session)) * 1000
    print(f"recording overhead per turn: {s - p:+.2f} ms (median of paired differences {d:+.2f} ms)  "
          f"ratio session/plain = {s / p:.3f} (target <= 1.05)")
    for k in range(args.turns):
        pk, sk = (statistics.median(x[k::args.turns]) * 1000 for x in (plain, session))
        print(f"  turn {k + 1}: plain {pk:7.2f} ms  session {sk:7.2f} ms  ({sk - pk:+.2f} ms)")
    print(f"finish (reward + push to Redis): median {f:.2f} ms per session = {f / args.turns:.2f} ms per turn amortised;"
          f" with it the ratio is {(s + f / args.turns) / p:.3f}")


if __name__ == "__main__":
    main()

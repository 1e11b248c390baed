"""``/health`` latency while a request's own chat template (a nested Jinja loop) renders on a rollout service with
``trust_request_chat_template`` (docs/security-rollout.md). One rollout process (hf engine, tiny model); the
attack request is sent once and ``/health`` is polled every 50 ms until it is answered. Reported: the attack's
status, time and message, and the /health latencies meanwhile (count, median, max).

    .venv/bin/python benchmarks/health_under_template.py [--timeout-s 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from deploy.local.tiny_model import build_tiny_causal_lm
from tests.procs import stop
from tests.rollout.conftest import start_rollout

LOOP = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout-s", type=float, default=5.0, help="limits.chat_template_timeout_s of the service")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    model = build_tiny_causal_lm(tmp / "model")
    proc, url, _ = start_rollout(tmp, "rollout", {
        "model": str(model), "trust_request_chat_template": True, "limits": {"chat_template_timeout_s": args.timeout_s},
        "engine": {"kind": "hf", "device": "cpu", "torch_threads": 1}})
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "chat_template_kwargs": {"chat_template": LOOP}}
        with ThreadPoolExecutor(1) as pool:
            t0 = time.monotonic()
            attack = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=body, timeout=args.timeout_s + 30)
            latencies = []
            while not attack.done():
                s = time.monotonic()
                httpx.get(f"{url}/health", timeout=5)
                latencies.append(time.monotonic() - s)
                time.sleep(0.05)
            r = attack.result()
        latencies.sort()
        print(f"attack answered {r.status_code} after {time.monotonic() - t0:.2f}s: {r.json()['error']['message']}")
        print(f"/health meanwhile: n={len(latencies)} median {latencies[len(latencies) // 2] * 1000:.1f} ms, "
              f"max {latencies[-1] * 1000:.1f} ms")
    finally:
        stop(proc)


if __name__ == "__main__":
    main()

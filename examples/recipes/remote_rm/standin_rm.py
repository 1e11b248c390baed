"""A stand-in remote reward model speaking OpenRLHF's protocol (``openrlhf.cli.serve_rm``), for trying the
remote-RM recipe (``remote-rm.yaml``) without a GPU or a trained RM.

    python -m examples.recipes.remote_rm.standin_rm [--host 127.0.0.1] [--port 5000]

``POST /get_reward`` with ``{"query": [prompt + response, ...], "prompts"?: [...], "labels"?: [...]}`` answers
``{"rewards": [...], "scores": [...], "extra_logs": {}}`` (one float per query, in order); ``GET /health``
answers ``{"status": "ok"}``. Like a real RM it judges the text alone (labels are ignored): for the sort-digits
task (``sort 3721=`` -> ``1237``) the reward is 1.0 when the response is the prompt's digits sorted, else 0.0.
Bad bodies get a 400 with a JSON ``{"error": ...}`` saying what is wrong. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROMPT = re.compile(r"sort (\d+)=")


class BadBody(ValueError):
    """A /get_reward body this server cannot read (a 400 with this message)."""


def reward(query: str, prompt: str | None) -> float:
    """1.0 when the text after the prompt is the prompt's digits sorted."""
    m = PROMPT.search(prompt if prompt is not None else query)
    if m is None:
        return 0.0
    response = query[len(prompt):] if prompt is not None and query.startswith(prompt) else query[m.end():]
    return 1.0 if response.strip() == "".join(sorted(m.group(1))) else 0.0


def rewards(body: object) -> list[float]:
    """The rewards of a /get_reward body; :class:`BadBody` says what is wrong with it."""
    if not isinstance(body, dict) or not isinstance(body.get("query"), list):
        raise BadBody("the body must be a JSON object with `query`: a list of strings")
    queries, prompts = body["query"], body.get("prompts")
    if not all(isinstance(q, str) for q in queries):
        raise BadBody("`query` must hold strings (prompt + response)")
    if prompts is not None and (not isinstance(prompts, list) or len(prompts) != len(queries)
                                or not all(isinstance(p, str) for p in prompts)):
        raise BadBody("`prompts`, when given, must be one string per query")
    return [reward(q, prompts[i] if prompts else None) for i, q in enumerate(queries)]


class Handler(BaseHTTPRequestHandler):
    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {"status": "ok"})
        else:
            self._send(404, {"error": f"no route GET {self.path}"})

    def do_POST(self) -> None:
        if self.path != "/get_reward":
            self._send(404, {"error": f"no route POST {self.path} (this server answers POST /get_reward)"})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"null")
            values = rewards(body)
        except ValueError as exc:  # BadBody and json.JSONDecodeError
            self._send(400, {"error": str(exc)})
            return
        self._send(200, {"rewards": values, "scores": values, "extra_logs": {}})

    def log_message(self, fmt: str, *args: object) -> None:  # one line per request is noise at RL rates
        return


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.recipes.remote_rm.standin_rm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5000)
    args = ap.parse_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"stand-in RM (OpenRLHF /get_reward) on http://{args.host}:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a run is doing, read from its services (learner ``/status``, rollout and reward ``/health``) into one
:class:`RunView`, and the first error of any service in plain words."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from deploy.local.fleet import Fleet
from deploy.run.learner_ranks import is_follower

_ERROR_LINE = re.compile(r"^(error:|[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b)")


def first_error(log_text: str) -> str:
    """The line of a service's log that says what went wrong: the last exception line of its last traceback, or
    an ``error:`` line, else its last line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.match(line):
            return line[:400]
    return lines[-1][:400] if lines else "(its log is empty)"


def fleet_error_line(exc: BaseException, logs: Path) -> str:
    """One line for a service that failed to start or died (a FleetError: its first line says which, the rest
    is its log's tail): what happened, the reason its log gives, and the log to read."""
    head, _, tail = str(exc).partition("\n")
    name = head.split(" ", 1)[0]
    return f"{head.rstrip().rstrip(':')}: {first_error(tail)} (its log: {logs / f'{name}.log'})"


class SampleTail:
    """The latest line of the learner's ``samples.jsonl`` as one line to show (read again only when the file
    grew): ``step 40: 'sort 0123=' -> '0123' (reward 1.00, 5 tokens)``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._size = -1
        self.line: str | None = None

    def latest(self) -> str | None:
        try:
            size = self.path.stat().st_size
        except OSError:
            return self.line
        if size != self._size:
            self._size = size
            with self.path.open("rb") as f:
                f.seek(max(0, size - 65536))
                tail = f.read().decode("utf-8", "replace").splitlines()
            for raw in reversed(tail):
                try:
                    row = json.loads(raw)
                except ValueError:
                    continue
                self.line = sample_line(row)
                break
        return self.line


def sample_line(row: dict[str, Any], width: int = 80) -> str:
    """A samples.jsonl row in one line: step, prompt -> completion (both cut to ``width``), reward, length."""

    def cut(text: Any) -> str:
        text = repr(str(text or ""))
        return text if len(text) <= width else text[:width - 3] + "..."

    at_max = ", hit max_new_tokens" if row.get("finish_reason") == "length" else ""
    reward = row.get("reward")
    shown = "--" if not isinstance(reward, (int, float)) else f"{reward:.2f}"
    return (f"step {row.get('step')}: {cut(row.get('prompt_text'))} -> {cut(row.get('response_text'))} "
            f"(reward {shown}, {row.get('response_tokens')} tokens{at_max})")


@dataclass
class ServiceView:
    name: str
    state: str  # starting, ok, unhealthy, exited N
    doing: str = ""


@dataclass
class EvalPoint:
    step: int
    accuracy: float
    weight_version: str
    mean_reward: float | None = None


@dataclass
class RunView:
    run_name: str
    phase: str = "starting"
    step: int = 0
    total: int = 0
    weight_version: int | None = None
    reward: float | None = None
    eta_s: float | None = None
    waiting: str | None = None
    #: the last step's off-policy figures: staleness of the oldest token (mean, max), engine-vs-learner mismatch
    #: (k3), share of tokens the correction rejected
    off_policy: dict[str, float] = field(default_factory=dict)
    evals: list[EvalPoint] = field(default_factory=list)
    services: list[ServiceView] = field(default_factory=list)
    error: str | None = None
    algorithm: str = ""
    loss: float | None = None  # SFT, rm, dpo: the last step's loss
    #: preference runs (rm, dpo, online_dpo): TRL's rewards/accuracies of the last step's pairs, and the last
    #: held-out pairwise accuracy (rm, dpo)
    pair_accuracy: float | None = None
    heldout_pairs: float | None = None
    #: training health now: signal -> what to try (the learner's /status health, and held-out accuracy's)
    health: dict[str, str] = field(default_factory=dict)
    learner_health: dict[str, str] = field(default_factory=dict)
    #: scorers whose calls fail now, from every reward service: where (scorer and URL) -> (seconds, last error)
    reward_failing: dict[str, tuple[float, str]] = field(default_factory=dict)
    stalled: str | None = None  # the run waits on a failing scorer (deploy/run/reward_stall.py)
    #: the last step's mean completion length (tokens) and share of completions that hit max_new_tokens
    lengths: tuple[float, float] | None = None
    sample: str | None = None  # the latest completion the learner logged (samples.jsonl), as one line


OFF_POLICY = ("staleness_mean", "staleness_max", "mismatch_k3", "is_rejected_frac")


class Poller:
    """Reads every service of ``fleet`` once per :meth:`poll` (short timeouts: a busy service never stalls it)."""

    def __init__(self, fleet: Fleet, run_name: str) -> None:
        self.fleet = fleet
        self.view = RunView(run_name)
        self.learner: dict[str, Any] = {}
        self._first: tuple[float, int] | None = None
        self._client = httpx.Client(timeout=2.0)
        self.managed: set[str] = set()  # services a controller restarts or drains: their exits are not an error
        #: the failing scorers of the poll before: what a reward service that misses a poll said last stands
        self._failing_before: dict[str, tuple[float, str]] = {}

    def close(self) -> None:
        self._client.close()

    def _get(self, url: str) -> tuple[int, dict[str, Any]]:
        try:
            r = self._client.get(url)
            return r.status_code, r.json()
        except (httpx.HTTPError, ValueError):
            return 0, {}

    def poll(self) -> RunView:
        views = []
        self._failing_before, self.view.reward_failing = self.view.reward_failing, {}
        for name, svc in list(self.fleet.services.items()):
            if not svc.alive:  # a clean exit is "finished", not its log's last line (uvicorn's goodbye)
                views.append(ServiceView(name, f"exited {svc.proc.returncode}", "finished" if svc.proc.returncode == 0
                                         else first_error(svc.log_tail(20_000))))
                if self.view.error is None and svc.proc.returncode not in (0, None) and name not in self.managed:
                    self.view.error = f"{name} exited with code {svc.proc.returncode}: " \
                                      f"{first_error(svc.log_tail(20_000))}  (log: {svc.log_path})"
                continue
            if is_follower(name):  # a learner rank > 0: no HTTP; rank 0's /status speaks for the learner
                views.append(ServiceView(name, "ok", "following learner"))
                continue
            kind = name.split("-", 1)[0]
            views.append(getattr(self, f"_{kind}")(name, svc.url))
        self.view.services = views
        return self.view

    def _learner(self, name: str, url: str) -> ServiceView:
        code, st = self._get(f"{url}/status")
        if not st:
            return ServiceView(name, "starting")
        self.learner = st
        v = self.view
        v.phase = st.get("phase", "?")
        v.step, v.total = int(st.get("step") or 0), int(st.get("total_steps") or 0) or v.total
        v.weight_version = st.get("weight_version")
        v.waiting = st.get("waiting") or st.get("weights_problem")
        last = st.get("last_metrics") or {}
        reward = last.get("reward_mean")
        v.reward = reward if reward is not None else v.reward
        v.algorithm = st.get("algorithm") or v.algorithm
        v.loss = last.get("sft_loss", last.get("loss", v.loss))
        v.pair_accuracy = last.get("rewards/accuracies", v.pair_accuracy)
        points = st.get("heldout_pairs") or []
        v.heldout_pairs = points[-1]["accuracy"] if points and isinstance(points[-1], dict) else v.heldout_pairs
        v.learner_health = {w["signal"]: w["message"] for w in st.get("health") or [] if isinstance(w, dict)}
        if isinstance(last.get("response_len_mean"), (int, float)):
            v.lengths = (float(last["response_len_mean"]), float(last.get("truncated_frac") or 0.0))
        v.off_policy = {k: last[k] for k in OFF_POLICY if isinstance(last.get(k), (int, float))} or v.off_policy
        now = time.monotonic()
        if self._first is None or v.step < self._first[1]:
            self._first = (now, v.step)
        done = v.step - self._first[1]
        v.eta_s = (now - self._first[0]) / done * max(0, v.total - v.step) if done > 0 else None
        if v.phase == "failed" and st.get("error") and v.error is None:
            v.error = f"learner failed: {st['error']}"
        doing = v.waiting or f"{v.phase}, step {v.step}/{v.total}"
        return ServiceView(name, "ok" if code == 200 else "unhealthy", doing)

    def _rollout(self, name: str, url: str) -> ServiceView:
        code, h = self._get(f"{url}/health")
        if not h:
            return ServiceView(name, "starting")
        doing = "paused (weight update)" if h.get("paused") else "generating"
        return ServiceView(name, "ok" if code == 200 else "unhealthy", f"{doing}, weights v{h.get('weight_version')}")

    def _reward(self, name: str, url: str) -> ServiceView:
        code, h = self._get(f"{url}/health")
        if not h:  # no answer this time (starting, or too busy): its scorers are as it said last
            self.view.reward_failing.update(self._failing_before)
            return ServiceView(name, "starting")
        failing = {k: f for k, f in (h.get("failing") or {}).items() if isinstance(f, dict) and f.get("where")}
        for f in failing.values():
            seen = self.view.reward_failing.get(f["where"], (0.0, ""))
            if float(f.get("for_s") or 0) >= seen[0]:
                self.view.reward_failing[f["where"]] = (float(f.get("for_s") or 0), str(f.get("error", "")))
        problems = [f"{failing[k]['where'] if k in failing else f'reward scorer {k!r}'}: {v}"
                    for k, v in (h.get("scorers") or {}).items() if v not in ("ok", True)]
        if code == 200 and not failing:
            return ServiceView(name, "ok", "scoring")
        if not problems:  # the breaker is closed, but calls fail
            problems = [f"{f['where']}: failing for {float(f.get('for_s') or 0):.0f} s ({f.get('error', '')})"
                        for f in failing.values()]
        return ServiceView(name, "ok" if code == 200 else "unhealthy", "; ".join(problems) or f"answered {code}")

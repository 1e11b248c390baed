"""What a run is doing, read from its services (learner ``/status``, rollout and reward ``/health``) into one
:class:`RunView`, and the first error of any service in plain words."""

from __future__ import annotations

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
    loss: float | None = None  # SFT: the last step's loss
    #: training health now: signal -> what to try (the learner's /status health, and held-out accuracy's)
    health: dict[str, str] = field(default_factory=dict)
    learner_health: dict[str, str] = field(default_factory=dict)


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
        for name, svc in list(self.fleet.services.items()):
            if not svc.alive:
                views.append(ServiceView(name, f"exited {svc.proc.returncode}", first_error(svc.log_tail(20_000))))
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
        v.step, v.total = int(st.get("step") or 0), int(st.get("total_steps") or 0)
        v.weight_version = st.get("weight_version")
        v.waiting = st.get("waiting") or st.get("weights_problem")
        last = st.get("last_metrics") or {}
        reward = last.get("reward_mean")
        v.reward = reward if reward is not None else v.reward
        v.algorithm = st.get("algorithm") or v.algorithm
        v.loss = last.get("sft_loss", v.loss)
        v.learner_health = {w["signal"]: w["message"] for w in st.get("health") or [] if isinstance(w, dict)}
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
        if not h:
            return ServiceView(name, "starting")
        problems = {k: v for k, v in (h.get("scorers") or {}).items() if v not in ("ok", True)}
        return ServiceView(name, "ok" if code == 200 else "unhealthy",
                           "scoring" if code == 200 else f"unhealthy: {problems or h}")

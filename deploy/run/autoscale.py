"""``fleetrl run``'s controller for an elastic rollout pool (``replicas.rollout: {min: 1, max: 4}``).

:func:`decide` is the whole policy, pure: from the pool's settings, the replicas running, those that died, and
the learner's demand signal (``shared.keys.pool_signal(run)``, ``services/learner/watches/pool_signal.py``) it returns
one :class:`Decision` with its reason. In order:

1. a replica that died (exited without being drained) is replaced, at once;
2. fewer than ``min`` replicas: start up to ``min``; more than ``max``: drain down to ``max``;
3. no signal, or one older than ``signal_max_age_s``, or one measured before the last change finished
   (its ``at`` precedes it): hold;
4. the signal's ``desired_replicas``, clamped to ``[min, max]``, is the target. Above the pool: grow to it once
   ``cooldown_up_s`` has passed since the last change, unless the signal asks for no more than the live replicas
   it counted and that count includes one being drained (a pool of 2 "within the band" while one drains is no
   reason to start one again: the elastic drill went 2 -> 1 -> 2 on such a signal). Below: never while the signal counts fewer live
   replicas than are running (it was measured before the replicas starting joined: a pool of 1 asking for 2 while
   2 more start is no reason to drain one); else drain one replica once the signal has asked for
   fewer for ``down_stable_s`` and ``cooldown_down_s`` has passed (one at a time: each drain is measured before
   the next). The learner's own band (``pool.wait_low`` .. ``pool.wait_high``) and these waits are the
   hysteresis: the pool does not flap between two sizes on a noisy signal.

:class:`Autoscaler` carries decisions out on the local fleet: it starts planned replicas (``rollout-<i>``, whose
ports and devices the run planned up to ``max``), drains the newest with ``POST /drain`` (it finishes or hands
back its prompts, deregisters and exits), restarts one that died, and says every change, with its reason, on
the display (and so in the log).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from deploy.local.fleet import Fleet
from shared import keys

from .plan import ProcessPlan
from .spec import RolloutPoolSpec


@dataclass(frozen=True)
class Decision:
    action: Literal["hold", "up", "down", "replace"]
    count: int
    reason: str
    target: int | None = None


@dataclass
class PoolMemory:
    """What :func:`decide` remembers between calls (the caller keeps it)."""

    last_change_at: float = float("-inf")  # wall clock (time.time()) of the last change that finished
    fewer_since: float | None = None  # since when the signal asks for fewer replicas than run


def decide(pool: RolloutPoolSpec, *, running: int, died: list[str], signal: dict[str, Any] | None, now: float,
           memory: PoolMemory) -> Decision:
    """The controller's next move (rules: the module docstring). ``running``: replicas started and not draining;
    ``now``: wall-clock seconds (the signal's ``at`` is the learner's wall clock). Updates ``memory.fewer_since``."""
    if died:
        return Decision("replace", len(died), f"{', '.join(died)} died: replacing")
    if running < pool.min:
        return Decision("up", pool.min - running, f"{running} replica(s) running, below min {pool.min}", pool.min)
    if running > pool.max:
        return Decision("down", running - pool.max, f"{running} replica(s) running, above max {pool.max}", pool.max)
    if signal is None:
        memory.fewer_since = None
        return Decision("hold", 0, "no demand signal from the learner yet")
    age = now - float(signal.get("at", 0.0))
    if age > pool.signal_max_age_s:
        memory.fewer_since = None
        return Decision("hold", 0, f"the demand signal is {age:.0f}s old (signal_max_age_s {pool.signal_max_age_s:g})")
    if float(signal.get("at", 0.0)) < memory.last_change_at:
        return Decision("hold", 0, "waiting for a signal measured after the last change")
    desired = int(signal.get("desired_replicas", running))
    target = min(max(desired, pool.min), pool.max)
    why = str(signal.get("reason", ""))
    if target > running:
        memory.fewer_since = None
        seen = int(signal.get("replicas", running))
        if desired <= seen and seen > running:  # "keep the R I see", R counting a replica being drained
            return Decision("hold", 0, f"the learner asks for {desired}, no more than the {seen} live replica(s) it "
                                       f"measured of {running} running: waiting for the drain to finish", target)
        wait = pool.cooldown_up_s - (now - memory.last_change_at)
        if wait > 0:
            return Decision("hold", 0, f"the learner asks for {desired}; cooldown_up_s, {wait:.0f}s left", target)
        return Decision("up", target - running, f"the learner asks for {desired} replica(s): {why}", target)
    if target < running:
        seen = int(signal.get("replicas", running))
        if seen < running:  # measured before the replicas starting joined: it cannot say the pool is too big
            memory.fewer_since = None
            return Decision("hold", 0, f"the learner asks for {desired}, measured on {seen} live replica(s) of "
                                       f"{running} running: waiting for the others to join", target)
        if memory.fewer_since is None:
            memory.fewer_since = now
        asked = now - memory.fewer_since
        if asked < pool.down_stable_s:
            return Decision("hold", 0, f"the learner asks for {desired} for {asked:.0f}s of down_stable_s "
                                       f"{pool.down_stable_s:g}", target)
        wait = pool.cooldown_down_s - (now - memory.last_change_at)
        if wait > 0:
            return Decision("hold", 0, f"the learner asks for {desired}; cooldown_down_s, {wait:.0f}s left", target)
        return Decision("down", 1, f"the learner asks for {desired} replica(s): {why}", target)
    memory.fewer_since = None
    return Decision("hold", 0, f"{running} replica(s), as the learner asks", target)


@dataclass
class Autoscaler:
    """Carries :func:`decide`'s moves out on a local :class:`Fleet` (see the module docstring)."""

    pool: RolloutPoolSpec
    plans: list[ProcessPlan]  # every planned rollout replica, rollout-0 .. rollout-<max-1>
    fleet: Fleet
    redis_url: str
    run_name: str
    token: str
    say: Callable[[str], None]
    memory: PoolMemory = field(default_factory=PoolMemory)
    draining: dict[str, float] = field(default_factory=dict)  # name -> when its drain was asked for
    starting: set[str] = field(default_factory=set)
    replaced: dict[str, int] = field(default_factory=dict)  # name -> times it died and was started again
    given_up: set[str] = field(default_factory=set)  # died more than max_replacements times: left out of the pool
    changes: list[dict[str, Any]] = field(default_factory=list)  # every change, for the run's record and tests
    _redis: Any = None

    def _signal(self) -> dict[str, Any] | None:
        import redis

        if self._redis is None:
            self._redis = redis.Redis.from_url(self.redis_url, socket_timeout=2, socket_connect_timeout=2)
        try:
            raw = self._redis.get(keys.pool_signal(self.run_name))
        except redis.RedisError:
            return None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def _running(self) -> list[str]:
        return [p.name for p in self.plans if p.name in self.fleet.services and p.name not in self.draining
                and self.fleet.services[p.name].alive]

    def _give_up_on_crash_loops(self, now: float) -> None:
        """A replica that died again after ``max_replacements`` restarts is stopped and left out (a crash loop
        would otherwise restart it forever): said once, with the reason in its log."""
        for p in self.plans:
            svc = self.fleet.services.get(p.name)
            if svc is None or svc.alive or p.name in self.draining or \
                    self.replaced.get(p.name, 0) < self.pool.max_replacements:
                continue
            from .progress import first_error

            reason = first_error(svc.log_tail(20_000))
            self.fleet.stop(p.name)
            self.starting.discard(p.name)
            self.given_up.add(p.name)
            self._record("give up", p.name, f"died {self.replaced[p.name] + 1} times (max_replacements "
                                            f"{self.pool.max_replacements}): {reason} (log: {svc.log_path})", now)

    def _died(self) -> list[str]:
        out = []
        for p in self.plans:
            svc = self.fleet.services.get(p.name)
            if svc is not None and not svc.alive and p.name not in self.draining:
                out.append(f"{p.name} (exit code {svc.proc.returncode})")
        return out

    def _record(self, action: str, name: str, reason: str, now: float) -> None:
        self.changes.append({"at": now, "action": action, "replica": name, "reason": reason})
        self.say(f"pool: {action} {name}: {reason}")

    def tick(self, now: float | None = None) -> Decision:
        """One look at the pool: reap drained replicas, mark started ones live, decide, act."""
        now = time.time() if now is None else now
        for name, asked in list(self.draining.items()):
            svc = self.fleet.services.get(name)
            if svc is None or not svc.alive:
                self.fleet.stop(name)  # reaped (already exited)
                del self.draining[name]
                self.memory.last_change_at = now
                self._record("left", name, f"drained and exited after {now - asked:.1f}s", now)
        for name in list(self.starting):
            svc = self.fleet.services.get(name)
            if svc is None or not svc.alive:
                self.starting.discard(name)
                continue
            try:
                ok = httpx.get(f"{svc.url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                self.starting.discard(name)
                self.memory.last_change_at = now
                self._record("joined", name, "healthy, taking prompts", now)
        self._give_up_on_crash_loops(now)
        died = self._died()
        decision = decide(self.pool, running=len(self._running()), died=died, signal=self._signal(), now=now,
                          memory=self.memory)
        acted = False
        if decision.action == "replace":
            for entry in died:
                name = entry.split(" ", 1)[0]
                self.replaced[name] = self.replaced.get(name, 0) + 1
                self.fleet.restart(name, wait=False)
                self.starting.add(name)
                self._record("replace", name, decision.reason, now)
                acted = True
        elif decision.action == "up":
            idle = [p for p in self.plans if p.name not in self.fleet.services and p.name not in self.given_up]
            for p in idle[:decision.count]:
                self.fleet.start(p.name, p.module, p.config, wait=False)
                self.starting.add(p.name)
                self._record("start", p.name, decision.reason, now)
                acted = True
        elif decision.action == "down":
            for name in list(reversed(self._running()))[:decision.count]:  # the newest first
                self._drain(name, decision.reason, now)
                acted = True
        if acted:
            self.memory.last_change_at = now
        return decision

    def _drain(self, name: str, reason: str, now: float) -> None:
        svc = self.fleet.services[name]
        try:
            r = httpx.post(f"{svc.url}/drain", headers={"Authorization": f"Bearer {self.token}"},
                           json={"timeout_s": self.pool.drain_timeout_s}, timeout=5)
            ok = r.status_code == 202
        except httpx.HTTPError as exc:
            ok, r = False, exc
        if not ok:  # cannot be asked: SIGTERM drains as well
            import signal

            self.fleet.signal(name, signal.SIGTERM)
        self.draining[name] = now
        self._record("drain", name, reason, now)

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()

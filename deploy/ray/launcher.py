"""Run a FleetRL deployment on a Ray cluster: Ray places, starts and restarts; the services do the rest.

- reward and rollout replicas: one :class:`ServiceProcessActor` each, with their CPU / GPU requests and
  ``max_restarts`` (a replica whose process dies, or whose actor is killed, is restarted by Ray and
  re-registers itself: Redis consumer group + weight-sync registry);
- the learner's ranks: actors in one placement group (bundle i = rank i), with MASTER_ADDR / RANK /
  WORLD_SIZE / LOCAL_RANK set for DeepSpeed's world; rank 0's node address is what rollout sidecars dial
  for weight sync (``publish.sync.master_addr``).

Everything still speaks HTTP, Redis and the weight-sync group, exactly as under compose or make demo.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from deploy.ray.service_actor import ServiceProcessActor
from deploy.ray.settings import LaunchSettings, ServiceGroup, merge
from deploy.run.autoscale import Decision, PoolMemory, decide
from shared import keys

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]


class LaunchError(RuntimeError):
    """A replica failed to become healthy or the learner failed."""


class FleetLauncher:
    """Starts the reward, rollout and learner actors of one run and watches the learner to the end."""

    def __init__(self, settings: LaunchSettings) -> None:
        self.s = settings
        token = os.environ.get(settings.control_token_env)
        if not token:
            raise LaunchError(f"${settings.control_token_env} is not set: the control-plane token is required")
        self.token = token
        # every queue record of the run is signed with it (shared/signing.py); one per launch unless given
        self.run_key = os.environ.get(settings.run_key_env) or secrets.token_hex(32)
        self.workdir = str(settings.workdir or REPO)
        self.actors: dict[str, list[Any]] = {"reward": [], "rollout": [], "learner": []}
        self.pg = None
        self._actor_cls = ray.remote(ServiceProcessActor)
        # an elastic rollout pool (settings.rollout_pool): deploy/run/autoscale.py's decide() on the learner's signal
        self.pool_memory = PoolMemory()
        self.draining: dict[Any, float] = {}  # rollout actor -> when its drain was asked for
        self.pool_changes: list[dict[str, Any]] = []
        self._next_rollout = settings.rollout.replicas
        self._reward_urls: list[str] = []
        self._redis: Any = None

    # ---- specs -----------------------------------------------------------------------------------
    def _spec(self, service: str, group: ServiceGroup, index: int, extra: dict[str, Any],
              env: dict[str, str] | None = None) -> dict[str, Any]:
        common: dict[str, Any] = {"auth_token": self.token}  # the reward service: the token guards /score; no Redis
        if service != "reward":
            common = {"control_token": self.token, "redis_url": self.s.redis_url, "run_name": self.s.run_name,
                      "run_key": self.run_key}
        return {
            "name": f"{service}-{index}", "module": f"services.{service}",
            "settings": merge(group.settings(), {**common, **extra}),
            "port": group.port + index if group.port else 0, "workdir": self.workdir,
            "env": {"OMP_NUM_THREADS": str(max(1, int(group.num_cpus))), **group.env, **(env or {})},
        }

    def _start(self, service: str, group: ServiceGroup, index: int, spec: dict[str, Any], **options: Any) -> Any:
        actor = self._actor_cls.options(
            name=f"{self.s.run_name}-{service}-{index}", namespace=self.s.namespace, num_cpus=group.num_cpus,
            num_gpus=group.num_gpus, max_restarts=group.max_restarts, max_task_retries=-1, **options,
        ).remote(spec)
        self.actors[service].append(actor)
        return actor

    def _wait_healthy(self, service: str, group: ServiceGroup, first: int | None = None) -> list[str]:
        """Wait for every replica's /health (the ``first`` ones only: learner ranks > 0 serve no HTTP); an actor
        Ray cannot place (too few resources) fails too."""
        refs = [a.wait_healthy.remote(group.health_timeout_s) for a in self.actors[service][:first]]
        try:
            return ray.get(refs, timeout=group.health_timeout_s + 60)
        except ray.exceptions.GetTimeoutError as exc:
            raise LaunchError(
                f"{service} replicas not healthy after {group.health_timeout_s + 60:.0f}s: each asks for "
                f"{group.num_cpus} CPU / {group.num_gpus} GPU; cluster has {ray.available_resources()} free"
            ) from exc
        except (ray.exceptions.RayError, TimeoutError, RuntimeError) as exc:
            raise LaunchError(f"{service} replicas did not become healthy: {exc}") from exc

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> dict[str, list[str]]:
        """Start every replica and wait for their /health (reward first: the rollout workers need its URLs; then
        rollout and learner side by side); returns the URLs per service."""
        s = self.s
        for i in range(s.reward.replicas):
            self._start("reward", s.reward, i, self._spec("reward", s.reward, i, {}))
        reward_urls = self._reward_urls = self._wait_healthy("reward", s.reward)
        for i in range(s.rollout.replicas):
            worker = {"worker": {"reward_url": reward_urls[i % len(reward_urls)],  # replicas share the scorers
                                 "reward_token": self.token}}
            self._start("rollout", s.rollout, i, self._spec("rollout", s.rollout, i, worker))

        # the learner starts while the rollout replicas load (it needs only Redis; its prompts wait for them)
        lg = s.learner
        bundle = {"CPU": lg.num_cpus, **({"GPU": lg.num_gpus} if lg.num_gpus else {})}
        self.pg = placement_group([bundle] * lg.replicas, strategy=lg.placement_strategy,
                                  name=f"{s.run_name}-learner")
        try:
            ray.get(self.pg.ready(), timeout=lg.health_timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise LaunchError(f"learner placement group ({lg.replicas} x {bundle}) not placed after "
                              f"{lg.health_timeout_s:.0f}s; cluster has {ray.available_resources()} free") from exc
        master = ray.get(_node_ip.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            self.pg, placement_group_bundle_index=0), num_cpus=0).remote())
        for rank in range(lg.replicas):
            env = {"MASTER_ADDR": master, "MASTER_PORT": str(lg.dist_port), "RANK": str(rank),
                   "WORLD_SIZE": str(lg.replicas), "LOCAL_RANK": "0"}
            extra = {"publish": {"sync": {"master_addr": master}}}
            self._start("learner", lg, rank, self._spec("learner", lg, rank, extra, env),
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            self.pg, placement_group_bundle_index=rank, placement_group_capture_child_tasks=True))
        rollout_urls = self._wait_healthy("rollout", s.rollout)
        learner_urls = self._wait_healthy("learner", lg, first=1)  # rank 0 speaks for the learner's ranks
        return {"reward": reward_urls, "rollout": rollout_urls, "learner": learner_urls}

    def learner_returncode(self) -> int | None:
        """Rank 0's exit code once it finished, else None (a crashed rank is restarted by Ray)."""
        return ray.get(self.actors["learner"][0].returncode.remote())

    def wait(self, timeout_s: float | None = None, poll_s: float = 2.0) -> int:
        """Block until the learner exits by itself (training done); returns its exit code."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            code = self.learner_returncode()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() > deadline:
                raise LaunchError(f"learner still running after {timeout_s:.0f}s")
            if self.s.rollout_pool is not None:
                self.tick_pool()
            time.sleep(poll_s)

    # ---- an elastic rollout pool -----------------------------------------------------------------
    def _pool_signal(self) -> dict[str, Any] | None:
        import redis

        from shared.redis_errors import REDIS_FAILED

        if self._redis is None:
            self._redis = redis.Redis.from_url(self.s.redis_url, socket_timeout=2, socket_connect_timeout=2)
        try:
            raw = self._redis.get(keys.pool_signal(self.s.run_name))
            return json.loads(raw) if raw else None
        except REDIS_FAILED:  # no signal read: the pool holds still
            return None
        except ValueError:
            return None

    def _pool_change(self, action: str, name: str, reason: str, now: float) -> None:
        self.pool_changes.append({"at": now, "action": action, "replica": name, "reason": reason})
        log.info("pool: %s %s: %s", action, name, reason)

    def tick_pool(self, now: float | None = None) -> Decision:
        """One look at the elastic rollout pool: reap drained actors, decide (deploy/run/autoscale.py), act. Ray
        restarts an actor whose service died (max_restarts), so the decision sees no dead replica."""
        pool = self.s.rollout_pool
        assert pool is not None, "tick_pool needs settings.rollout_pool"
        now = time.time() if now is None else now
        for actor, asked in list(self.draining.items()):
            try:
                code = ray.get(actor.returncode.remote(), timeout=10)
            except (ray.exceptions.RayError, TimeoutError):
                code = -1  # the actor is gone: nothing left to drain
            if code is not None:
                ray.kill(actor, no_restart=True)
                self.actors["rollout"].remove(actor)
                del self.draining[actor]
                self.pool_memory.last_change_at = now
                self._pool_change("left", "rollout", f"drained and exited after {now - asked:.1f}s", now)
        running = [a for a in self.actors["rollout"] if a not in self.draining]
        decision = decide(pool, running=len(running), died=[], signal=self._pool_signal(), now=now,
                          memory=self.pool_memory)
        if decision.action == "up":
            group = self.s.rollout
            for _ in range(decision.count):
                i = self._next_rollout
                self._next_rollout += 1
                extra = {"worker": {"reward_url": self._reward_urls[i % len(self._reward_urls)]}} \
                    if self._reward_urls else {}
                self._start("rollout", group, i, self._spec("rollout", group, i, extra))
                self._pool_change("start", f"rollout-{i}", decision.reason, now)
            self.pool_memory.last_change_at = now
        elif decision.action == "down":
            for actor in list(reversed(running))[:decision.count]:  # the newest first
                ray.get(actor.leave.remote(), timeout=10)
                url = ray.get(actor.url.remote(), timeout=10)
                try:
                    httpx.post(f"{url}/drain", json={"timeout_s": pool.drain_timeout_s},
                               headers={"Authorization": f"Bearer {self.token}"}, timeout=10).raise_for_status()
                except httpx.HTTPError:  # cannot be asked: SIGTERM drains as well
                    ray.get(actor.stop.remote(pool.drain_timeout_s + 30), timeout=pool.drain_timeout_s + 60)
                self.draining[actor] = now
                self._pool_change("drain", url, decision.reason, now)
            self.pool_memory.last_change_at = now
        return decision

    def info(self) -> dict[str, list[dict]]:
        return {svc: ray.get([a.info.remote() for a in actors]) for svc, actors in self.actors.items()}

    def stop(self) -> None:
        """Stop the services (learner first, so it checkpoints), then the actors and the placement group."""
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        self._stop()

    def _stop(self) -> None:
        for svc in ("learner", "rollout", "reward"):
            refs = [a.stop.remote() for a in self.actors[svc]]
            try:
                ray.get(refs, timeout=60)
            except (ray.exceptions.RayError, TimeoutError) as exc:  # mid-restart: killing it below is enough
                log.warning("stopping %s: %s", svc, exc)
            for a in self.actors[svc]:
                ray.kill(a, no_restart=True)
            self.actors[svc] = []
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None


@ray.remote
def _node_ip() -> str:
    return ray.util.get_node_ip_address()

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

import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from deploy.ray.service_actor import ServiceProcessActor
from deploy.ray.settings import LaunchSettings, ServiceGroup, merge

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

    def _wait_healthy(self, service: str, group: ServiceGroup) -> list[str]:
        """Wait for every replica's /health; an actor Ray cannot place (too few resources) fails too."""
        refs = [a.wait_healthy.remote(group.health_timeout_s) for a in self.actors[service]]
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
        reward_urls = self._wait_healthy("reward", s.reward)
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
        learner_urls = self._wait_healthy("learner", lg)
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
            time.sleep(poll_s)

    def info(self) -> dict[str, list[dict]]:
        return {svc: ray.get([a.info.remote() for a in actors]) for svc, actors in self.actors.items()}

    def stop(self) -> None:
        """Stop the services (learner first, so it checkpoints), then the actors and the placement group."""
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

"""``make compose-test``: the compose stack for real, under podman-compose, on CPU.

1. podman + a local Debian base image (deploy/compose/podman-setup.sh), the CPU torch wheel and the
   host's CA bundle staged into deploy/docker/stage/ (git-ignored).
2. Build fleetrl-base from that base, then the thin rollout / reward / learner images and the prepare image.
3. ``podman-compose -f docker-compose.yml -f deploy/compose/podman-local.yml up -d`` with a few SFT and
   GRPO steps; wait on the services' /health.
4. Check: reward was scored (reward /metrics), weights were published (the rollout reports a new
   ``weight_version`` and the learner's steps advance).
5. The elastic pool, while the learner trains: scale rollout 1 -> 3 (each joiner healthy, how it got its first
   weights, every replica serves /generate), 3 learner steps later back to 1 (each replica taken away exits 0
   within ``stop_grace_period`` after logging its drain, and leaves the weight-sync registry); the learner
   trains on with one replica and finishes; the remaining replica holds the final version.
6. Accounting (Redis and the learner's metrics.jsonl): no dead letters, no prompt pending on a replica that
   left, every trained dataset position's group once and whole, nothing given up.
7. ``down -v``, always. Prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import redis
import yaml

from deploy.compose.elastic_checks import drained_line, grace_seconds, trained_positions
from shared import keys
from shared.ports import free_port
from shared.weight_sync import keys as wkeys
from shared.weight_sync.wire import ReplicaInfo

REPO = Path(__file__).resolve().parents[2]
STAGE = REPO / "deploy" / "docker" / "stage"
PROJECT = "fleetrl-ct"
_LEARNER_CONFIG = yaml.safe_load((REPO / "deploy" / "compose" / "config" / "learner.yaml").read_text())
RUN_NAME = _LEARNER_CONFIG["run_name"]
GROUP_SIZE = _LEARNER_CONFIG["rollout"]["group_size"]
# The test's own override (on top of podman-local.yml): the learner logs each step's sample ids, which the
# accounting after the scale 1 -> 3 -> 1 reads from metrics.jsonl on the checkpoints volume.
TEST_OVERRIDE = """services:
  learner:
    environment:
      FLEETRL_LEARNER_OBSERVABILITY__LOG_SAMPLE_IDS: "true"
"""


def say(msg: str) -> None:
    print(f"[compose-test {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Failure(RuntimeError):
    pass


def sh(cmd: list[str] | str, *, check: bool = True, capture: bool = False, env: dict | None = None,
       timeout: float | None = None) -> subprocess.CompletedProcess:
    args = shlex.split(cmd) if isinstance(cmd, str) else cmd
    res = subprocess.run(args, cwd=REPO, env=env, text=True, timeout=timeout, check=False,
                         stdout=subprocess.PIPE if capture else None, stderr=subprocess.STDOUT if capture else None)
    if check and res.returncode != 0:
        raise Failure(f"{' '.join(args)} failed ({res.returncode}){':' + res.stdout[-3000:] if capture else ''}")
    return res


def stage_build_inputs() -> None:
    STAGE.mkdir(parents=True, exist_ok=True)
    wheel_dir = Path(os.environ.get("FLEETRL_WHEELS", "/opt/wheels"))
    for whl in wheel_dir.glob("torch-*+cpu-*.whl"):
        if not (STAGE / whl.name).exists():
            shutil.copy2(whl, STAGE / whl.name)
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    if ca.exists():
        shutil.copy2(ca, STAGE / "ca-bundle.crt")


def build_images(podman: list[str], base: str) -> dict[str, float]:
    times = {}
    t = time.monotonic()
    sh(podman + ["build", "--network=host", "--build-arg", f"BASE_IMAGE={base}", "-f", "deploy/docker/base.Dockerfile",
                 "-t", "fleetrl-base", "."])
    times["base"] = round(time.monotonic() - t, 1)
    for svc in ("reward", "rollout", "learner", "prepare"):
        t = time.monotonic()
        sh(podman + ["build", "--network=host", "--build-arg", "BASE_IMAGE=localhost/fleetrl-base",
                     "-f", f"deploy/docker/{svc}.Dockerfile", "-t", f"fleetrl-{svc}", "."])
        times[svc] = round(time.monotonic() - t, 1)
    return times


class Stack:
    def __init__(self, podman: list[str], wrapper: Path, env: dict[str, str], override: Path) -> None:
        self.podman, self.env = podman, env
        self.compose = ["podman-compose", "--podman-path", str(wrapper), "-p", PROJECT,
                        "-f", "docker-compose.yml", "-f", "deploy/compose/podman-local.yml", "-f", str(override)]

    def run(self, *args: str, check: bool = True, capture: bool = False, timeout: float | None = 900):
        return sh(self.compose + list(args), check=check, capture=capture, env=self.env, timeout=timeout)

    def down(self) -> None:
        """``down -v``, plus any container of the project it does not know about (scaled replicas)."""
        self.run("down", "-v", check=False, timeout=300)
        left = sh(self.podman + ["ps", "-aq", "--filter", f"label=io.podman.compose.project={PROJECT}"],
                  capture=True).stdout.split()
        if left:
            sh(self.podman + ["rm", "-f", *left], check=False, capture=True)
            self.run("down", "-v", check=False, timeout=300)
        sh(self.podman + ["network", "rm", "-f", f"{PROJECT}_fleet"], check=False, capture=True)

    def containers(self, service: str, everything: bool = False) -> list[str]:
        out = sh(self.podman + ["ps", *(["-a"] if everything else []), "--format", "{{.Names}}", "--filter", f"label=io.podman.compose.project={PROJECT}",
                                "--filter", f"label=com.docker.compose.service={service}"], capture=True).stdout
        return sorted(n for n in out.split() if n)

    def ip(self, container: str) -> str:
        out = sh(self.podman + ["inspect", container, "--format",
                                "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}"], capture=True).stdout
        ips = out.split()
        if not ips:
            raise Failure(f"{container} has no IP address")
        return ips[0]

    def url(self, container: str, port: int) -> str:
        return f"http://{self.ip(container)}:{port}"

    def inspect(self, container: str, fmt: str) -> str:
        return sh(self.podman + ["inspect", container, "--format", fmt], capture=True).stdout.strip()

    def logs(self, container: str, tail: int = 60) -> str:
        return sh(self.podman + ["logs", "--tail", str(tail), container], check=False, capture=True).stdout


def wait_until(what: str, fn, timeout: float, poll: float = 2.0, on_timeout=None):
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (httpx.HTTPError, Failure, ValueError, KeyError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(poll)
    extra = on_timeout() if on_timeout else ""
    raise Failure(f"timed out after {timeout:.0f}s waiting for {what} (last: {last})\n{extra}")


def healthy(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=10).status_code == 200


def metric_sum(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:_total)?(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.MULTILINE))


class LearnerGone(RuntimeError):
    """The learner exited while a step waited on its progress: no wait on it can end any more."""


def scale_up(stack: Stack, n: int, token: str, dump) -> dict:
    """``up -d --no-build --scale rollout=N rollout`` mid-run: every container healthy, and how each joiner got its
    first weights (``/weights/version``'s ``first_update``: ``peer`` is the elastic pool's join)."""
    before = set(stack.containers("rollout"))
    say(f"scaling rollout {len(before)} -> {n}")
    t0 = time.monotonic()
    stack.run("up", "-d", "--no-build", "--scale", f"rollout={n}", "rollout")
    wait_until(f"{n} rollout containers", lambda: len(stack.containers("rollout")) == n, 120)
    urls = {c: stack.url(c, 8001) for c in stack.containers("rollout")}
    wait_until(f"{n} rollout replicas healthy", lambda: all(healthy(u) for u in urls.values()), 300, on_timeout=dump)
    out: dict = {"healthy_s": round(time.monotonic() - t0, 1), "joined": {}}
    for c, u in urls.items():
        if c in before:
            continue
        st = httpx.get(f"{u}/weights/version", headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
        first = st.get("first_update") or {}
        out["joined"][c] = {k: first.get(k) for k in ("source", "version", "peer", "seconds")}
    return out


def scale_down(stack: Stack, n: int, redis_client, dump) -> dict:
    """``up -d --no-build --scale rollout=N rollout`` back down mid-run, then check that each replica taken away
    drained: exited 0 within the service's ``stop_grace_period`` (not killed), logged its drain, and left the
    weight-sync registry. podman-compose (1.6) does not stop the surplus containers on a scale-down (it only
    creates and starts the missing ones); where they are still running they are stopped as docker compose
    does (highest number first, SIGTERM, SIGKILL after ``stop_grace_period``) and removed, and the figures say so."""
    grace = grace_seconds(compose_service("rollout").get("stop_grace_period"))
    before = stack.containers("rollout")
    say(f"scaling rollout {len(before)} -> {n} (stop_grace_period {grace:.0f}s)")
    ips = {c: stack.ip(c) for c in before}  # a replica's registry entry names its address (peer_url)
    registry_before = registry_addresses(redis_client)
    if sorted(registry_before) != sorted(ips.values()):
        raise Failure(f"the weight registry holds {registry_before}, the rollout containers are {ips}")
    t0 = time.monotonic()
    stack.run("up", "-d", "--no-build", "--scale", f"rollout={n}", "rollout")
    still = stack.containers("rollout")
    out: dict = {"compose_stopped_the_surplus": len(still) == n, "grace_s": grace, "drained": {}}
    keep = sorted(still, key=_replica_number)[:n]
    surplus = sorted((c for c in still if c not in keep), key=_replica_number, reverse=True)
    stop_s: dict[str, float] = {}
    for c in surplus:  # what docker compose does on a scale-down, one by one
        t = time.monotonic()
        sh(stack.podman + ["stop", "-t", str(int(grace)), c], capture=True, timeout=grace + 60)
        stop_s[c] = round(time.monotonic() - t, 1)
    gone = [c for c in before if c not in keep]
    wait_until(f"{len(gone)} rollout container(s) to exit", lambda: not set(gone) & set(stack.containers("rollout")),
               grace + 30, on_timeout=dump)
    out["scale_down_s"] = round(time.monotonic() - t0, 1)
    registry = registry_addresses(redis_client)
    for c in gone:
        code = stack.inspect(c, "{{.State.ExitCode}}")
        log = stack.logs(c, tail=400)
        drained = drained_line(log)
        left_registry = ips[c] not in registry
        out["drained"][c] = {"exit_code": int(code), "stop_s": stop_s.get(c),
                             "drain": drained.__dict__ if drained else None, "left_registry": left_registry}
        problems = [p for p, bad in ((f"exit code {code}", code != "0"), ("no drain in its log", drained is None),
                                     ("still in the weight registry", not left_registry),
                                     ("stopped only by SIGKILL", stop_s.get(c, 0) >= grace)) if bad]
        if problems:
            raise Failure(f"{c} did not leave the pool cleanly: {', '.join(problems)}\n{log[-3000:]}")
    for c in surplus:
        sh(stack.podman + ["rm", c], check=False, capture=True)
    if sorted(registry) != sorted(ips[c] for c in keep):
        raise Failure(f"after the scale-down the weight registry holds {registry}, the replicas kept are "
                      f"{[ips[c] for c in keep]}")
    out["registry"] = {"before": sorted(registry_before), "after": sorted(registry)}
    return out


def registry_addresses(redis_client) -> list[str]:
    """The host of each replica in the weight-sync registry (its ``peer_url``: the container's address)."""
    raw = redis_client.hgetall(wkeys.replicas(RUN_NAME))
    return [urlsplit(ReplicaInfo.loads(v).peer_url).hostname or "" for v in raw.values()]


def account(stack: Stack, redis_client, drained: dict) -> dict:
    """Nothing lost, trained twice or dead-lettered: the dead-letter streams are empty, no prompt is still pending
    on a replica that left, and the learner's history (``metrics.jsonl`` on the checkpoints volume) has every
    dataset position's group once and whole."""
    prompts = keys.prompts_stream(RUN_NAME)
    dead = {s: redis_client.xlen(keys.dead_letter_stream(s)) for s in (prompts, keys.experiences_stream(RUN_NAME))}
    left = {d["drain"]["consumer"] for d in drained.values() if d.get("drain")}
    pending = {}
    for row in redis_client.xpending(prompts, "rollout").get("consumers") or []:
        name = row["name"].decode() if isinstance(row["name"], bytes) else row["name"]
        pending[name] = int(row["pending"])
    held_by_left = {c: n for c, n in pending.items() if c in left and n}
    mount = sh(stack.podman + ["volume", "inspect", f"{PROJECT}_checkpoints", "--format", "{{.Mountpoint}}"],
               capture=True).stdout.strip()
    trained = trained_positions(Path(mount) / "learner" / "metrics.jsonl", GROUP_SIZE)
    out = {"dead_letters": dead, "pending_on_replicas_that_left": held_by_left, "steps": trained.steps,
           "groups_trained": trained.groups, "samples_trained": trained.samples,
           "positions_trained_twice": trained.twice[:10], "positions_trained_short": trained.short[:10],
           "learner_counters": trained.counters, "counters_rose_at_steps": trained.rose_at}
    problems = [p for p, bad in (("dead letters", any(dead.values())), ("prompts pending on a replica that left",
                                 held_by_left), ("positions trained twice", trained.twice),
                                 ("groups trained short", trained.short),
                                 ("prompts given up", trained.counters.get("prompts_abandoned"))) if bad]
    if problems:
        raise Failure(f"accounting after the scale 1 -> 3 -> 1: {', '.join(problems)}: {json.dumps(out)}")
    return out


def compose_service(name: str) -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"][name]


def _replica_number(container: str) -> int:
    m = re.search(r"(\d+)$", container)
    return int(m.group(1)) if m else 0


def run_checks(stack: Stack, args: argparse.Namespace, token: str) -> dict:
    figures: dict = {}
    t0 = time.monotonic()
    ctr = {s: stack.containers(s) for s in ("redis", "reward", "rollout", "learner")}
    missing = [s for s, c in ctr.items() if not c]
    if missing:
        raise Failure(f"no container for {missing}: {ctr}")
    reward_url = stack.url(ctr["reward"][0], 8002)
    rollout_url = stack.url(ctr["rollout"][0], 8001)
    learner_url = stack.url(ctr["learner"][0], 8003)
    dump = lambda: "\n".join(f"--- {c}\n{stack.logs(c)}" for cs in ctr.values() for c in cs)
    redis_client = redis.Redis(host=stack.ip(ctr["redis"][0]), port=6379, password=stack.env["REDIS_PASSWORD"],
                               socket_timeout=10)
    wait_until("reward /health", lambda: healthy(reward_url), 300, on_timeout=dump)
    wait_until("rollout /health (after the init service's SFT warm-up)", lambda: healthy(rollout_url),
               args.timeout, on_timeout=dump)
    figures["rollout_healthy_s"] = round(time.monotonic() - t0, 1)
    v0 = httpx.get(f"{rollout_url}/model_info", timeout=10).json()["weight_version"]
    wait_until("learner /health", lambda: healthy(learner_url), 300, on_timeout=dump)

    def learner_step() -> int:
        try:
            st = httpx.get(f"{learner_url}/status", timeout=10).json()
        except httpx.HTTPError:
            if not stack.containers("learner"):
                raise LearnerGone(f"the learner exited (rl_steps {args.rl_steps}: raise --rl-steps if it finished "
                                  f"before the pool was scaled)\n{dump()}") from None
            raise
        if st.get("phase") in ("finished", "stopped", "failed"):
            raise LearnerGone(f"the learner is {st.get('phase')} at step {st.get('step')} (rl_steps {args.rl_steps}: "
                              "raise --rl-steps if it finished before the pool was scaled)")
        return int(st.get("step") or 0)

    t_rl = time.monotonic()
    wait_until("learner step >= 3", lambda: learner_step() >= 3, args.timeout, on_timeout=dump)
    scored = metric_sum(httpx.get(f"{reward_url}/metrics", timeout=10).text, "fleetrl_reward_scorer_items")
    figures["reward_items_scored_by_step_3"] = scored
    if scored <= 0:
        raise Failure("the reward service scored nothing")
    v_now = wait_until("rollout weight_version past the initial one",
                       lambda: (v := httpx.get(f"{rollout_url}/model_info", timeout=10).json()["weight_version"]) != v0
                       and v, 120)
    figures["weight_version_initial"], figures["weight_version_at_step_3"] = v0, v_now

    step_at_scale = learner_step()
    figures["scale_up"] = scale_up(stack, args.replicas, token, dump)
    rollouts = stack.containers("rollout")
    urls = {c: stack.url(c, 8001) for c in rollouts}
    served = {}
    for c, u in urls.items():
        r = httpx.post(f"{u}/generate", json={"text": "sort 3721=", "sampling_params": {
            "temperature": 0.0, "max_new_tokens": 8}}, timeout=60)
        r.raise_for_status()
        body = r.json()
        served[c] = {"text": body["text"], "weight_version": body["meta_info"]["weight_version"]}
    figures["replicas_generate"] = served
    # the pool serves at 3 for a few steps, then goes back to 1 while the learner still trains
    at3 = learner_step()
    wait_until(f"3 learner steps with {args.replicas} replicas (step {at3} -> {at3 + 3})",
               lambda: learner_step() >= at3 + 3, args.timeout, on_timeout=dump)
    figures["scale_down"] = scale_down(stack, 1, redis_client, dump)
    at1 = learner_step()
    figures["learner_steps_at"] = {"scale_up": step_at_scale, "scale_down": at1}
    kept = stack.containers("rollout")
    urls = {c: stack.url(c, 8001) for c in kept}

    def finished() -> bool:
        try:
            st = httpx.get(f"{learner_url}/status", timeout=10).json()
        except httpx.HTTPError:
            return stack_learner_exited(stack)
        figures["learner_last_status"] = {k: st.get(k) for k in ("phase", "step", "weight_version")}
        figures["learner_last_reward_mean"] = (st.get("last_metrics") or {}).get("reward_mean")
        return st.get("phase") in ("finished", "stopped") or stack_learner_exited(stack)

    wait_until(f"learner to finish {args.rl_steps} steps", finished, args.timeout, poll=3, on_timeout=dump)
    figures["rl_wall_s"] = round(time.monotonic() - t_rl, 1)
    figures["learner_steps_after_scale_down"] = (figures.get("learner_last_status", {}).get("step") or 0) - at1
    if figures["learner_steps_after_scale_down"] <= 0:
        raise Failure(f"the learner trained no step after the scale-down (at step {at1})")
    # The replica that stayed reports the learner's final version (publish.every=1: version == steps).
    final = str(args.rl_steps)
    versions = wait_until(
        f"the remaining rollout replica on the final version {final}",
        lambda: (vs := {c: httpx.get(f"{u}/model_info", timeout=10).json()["weight_version"]
                        for c, u in urls.items()}) and set(vs.values()) == {final} and vs,
        120, on_timeout=dump)
    figures["replica_final_versions"] = versions
    figures["accounting"] = account(stack, redis_client, figures["scale_down"]["drained"])
    metrics = httpx.get(f"{reward_url}/metrics", timeout=10).text
    figures["reward_items_scored_total"] = metric_sum(metrics, "fleetrl_reward_scorer_items")
    return figures


def stack_learner_exited(stack: Stack) -> bool:
    out = sh(stack.podman + ["ps", "-a", "--format", "{{.Names}} {{.Status}}", "--filter",
                             f"label=io.podman.compose.project={PROJECT}", "--filter",
                             "label=com.docker.compose.service=learner"], capture=True).stdout
    return "Exited (0)" in out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make compose-test", description=__doc__.splitlines()[0])
    ap.add_argument("--sft-steps", type=int, default=30)
    ap.add_argument("--rl-steps", type=int, default=150,
                    help="GRPO steps: enough for the pool to go 1 -> 3 -> 1 while the learner trains")
    ap.add_argument("--replicas", type=int, default=3, help="rollout replicas mid-run, before going back to 1")
    ap.add_argument("--timeout", type=float, default=900.0, help="bound on each long wait (s)")
    ap.add_argument("--keep", action="store_true", help="leave the stack up (debugging)")
    ap.add_argument("--skip-build", action="store_true", help="use the images built last time")
    args = ap.parse_args(argv)
    if not shutil.which("podman-compose"):
        say("podman-compose missing: pip install podman-compose")
        return 2
    podman_cmd = subprocess.run(["bash", str(REPO / "deploy/compose/podman-setup.sh")], check=True, text=True,
                                stdout=subprocess.PIPE).stdout.strip().splitlines()[-1]
    podman = shlex.split(podman_cmd)
    wrapper = Path(os.environ.get("TMPDIR", "/tmp")) / "fleetrl-podman-wrapper.sh"
    wrapper.write_text(f"#!/bin/sh\nexec {podman_cmd} \"$@\"\n")
    wrapper.chmod(0o755)
    t0 = time.monotonic()
    figures: dict = {}
    if not args.skip_build:
        stage_build_inputs()
        say("building images (base from localhost/localdebian, then the thin service images)")
        figures["build_s"] = build_images(podman, os.environ.get("FLEETRL_LOCAL_BASE", "localhost/localdebian"))
    token = secrets.token_hex(16)
    env = {**os.environ, "FLEETRL_TOKEN": token, "REDIS_PASSWORD": secrets.token_hex(24),
           "FLEETRL_RUN_KEY": secrets.token_hex(32), "FLEETRL_DEMO_SFT_STEPS": str(args.sft_steps),
           "FLEETRL_DEMO_RL_STEPS": str(args.rl_steps), "FLEETRL_LEARNER_PORT": str(free_port()),
           "FLEETRL_THREADS": "1"}
    override = Path(os.environ.get("TMPDIR", "/tmp")) / "fleetrl-compose-test.yml"
    override.write_text(TEST_OVERRIDE)
    stack = Stack(podman, wrapper, env, override)
    stack.down()
    rc = 1
    try:
        t_up = time.monotonic()
        stack.run("up", "-d", "--no-build")
        figures["up_s"] = round(time.monotonic() - t_up, 1)
        figures.update(run_checks(stack, args, token))
        demo = stack.containers("demo", everything=True)
        if demo:  # the demo service measures held-out accuracy once the learner is done: let it finish
            wait_until("the demo service to exit", lambda: not stack.containers("demo"), 300)
            figures["demo_log_tail"] = stack.logs(demo[0], 4).strip().splitlines()
            if not any("held-out greedy accuracy after" in line for line in figures["demo_log_tail"]):
                raise Failure(f"the demo service measured no held-out accuracy:\n{stack.logs(demo[0], 30)}")
        rc = 0
    except (Failure, LearnerGone, subprocess.TimeoutExpired) as exc:
        say(f"FAILED: {exc}")
    finally:
        figures["total_s"] = round(time.monotonic() - t0, 1)
        if not args.keep:
            stack.down()
    print(json.dumps(figures, indent=2))
    say("PASSED" if rc == 0 else "FAILED")
    return rc


if __name__ == "__main__":
    sys.exit(main())

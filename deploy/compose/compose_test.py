"""``make compose-test``: the compose stack for real, under podman-compose, on CPU.

1. podman + a local Debian base image (deploy/compose/podman-setup.sh), the CPU torch wheel and the
   host's CA bundle staged into deploy/docker/stage/ (git-ignored).
2. Build fleetrl-base from that base, then the thin rollout / reward / learner images and the prepare image.
3. ``podman-compose -f docker-compose.yml -f deploy/compose/podman-local.yml up -d`` with a few SFT and
   GRPO steps; wait on the services' /health.
4. Check: reward was scored (reward /metrics), weights were published (the rollout reports a new
   ``weight_version`` and the learner's steps advance); scale rollout to 2 replicas while training
   runs and check both serve /generate on the latest version; the learner finishes.
5. ``down -v``, always. Prints the figures as JSON.
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

import httpx

from shared.ports import free_port

REPO = Path(__file__).resolve().parents[2]
STAGE = REPO / "deploy" / "docker" / "stage"
PROJECT = "fleetrl-ct"


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
    def __init__(self, podman: list[str], wrapper: Path, env: dict[str, str]) -> None:
        self.podman, self.env = podman, env
        self.compose = ["podman-compose", "--podman-path", str(wrapper), "-p", PROJECT,
                        "-f", "docker-compose.yml", "-f", "deploy/compose/podman-local.yml"]

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
    wait_until("reward /health", lambda: healthy(reward_url), 300, on_timeout=dump)
    wait_until("rollout /health (after the init service's SFT warm-up)", lambda: healthy(rollout_url),
               args.timeout, on_timeout=dump)
    figures["rollout_healthy_s"] = round(time.monotonic() - t0, 1)
    v0 = httpx.get(f"{rollout_url}/model_info", timeout=10).json()["weight_version"]
    wait_until("learner /health", lambda: healthy(learner_url), 300, on_timeout=dump)

    def learner_step() -> int:
        return int(httpx.get(f"{learner_url}/status", timeout=10).json().get("step") or 0)

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

    say("scaling rollout to 2 replicas")
    t_scale = time.monotonic()
    stack.run("up", "-d", "--no-build", "--scale", "rollout=2", "rollout")
    wait_until("2 rollout containers", lambda: len(stack.containers("rollout")) == 2, 120)
    rollouts = stack.containers("rollout")
    urls = [stack.url(c, 8001) for c in rollouts]
    wait_until("both rollout replicas healthy", lambda: all(healthy(u) for u in urls), 300, on_timeout=dump)
    figures["second_replica_healthy_s"] = round(time.monotonic() - t_scale, 1)
    served = {}
    for c, u in zip(rollouts, urls):
        r = httpx.post(f"{u}/generate", json={"text": "sort 3721=", "sampling_params": {
            "temperature": 0.0, "max_new_tokens": 8}}, timeout=60)
        r.raise_for_status()
        body = r.json()
        served[c] = {"text": body["text"], "weight_version": body["meta_info"]["weight_version"]}
    figures["replicas_generate"] = served
    step_at_scale = learner_step()

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
    figures["learner_steps_after_scale"] = (figures.get("learner_last_status", {}).get("step") or 0) - step_at_scale
    # Every replica reports the learner's final version (publish.every=1: version == steps); the second
    # replica joined mid-run and caught up through the weight-sync registry.
    final = str(args.rl_steps)
    versions = wait_until(
        f"every rollout replica on the final version {final}",
        lambda: (vs := {c: httpx.get(f"{u}/model_info", timeout=10).json()["weight_version"]
                        for c, u in zip(rollouts, urls)}) and set(vs.values()) == {final} and vs,
        120, on_timeout=dump)
    figures["replica_final_versions"] = versions
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
    ap.add_argument("--rl-steps", type=int, default=60)
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
    stack = Stack(podman, wrapper, env)
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
        rc = 0
    except (Failure, subprocess.TimeoutExpired) as exc:
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

"""``make drills``: the real fleet, one failure at a time, and an account of every prompt.

Each drill starts its own fleet on this machine (embedded Redis with AOF, the reward service with the
sort task's exact-answer rule, two rollout replicas with workers and weight sidecars, a GRPO learner
over 64 prompts, one epoch), breaks one thing mid-run, and lets the run finish:

- ``rollout-kill``: SIGKILL a rollout replica while it holds prompts mid-group, then restart it.
- ``learner-double-kill``: SIGKILL the learner between checkpoints, restart it, SIGKILL it again before
  the next checkpoint, restart it.
- ``reward-outage``: stop the reward service for 30 s (killed, then started again on its port).
- ``redis-restart``: SIGKILL Redis (AOF, ``appendfsync everysec``), start it again on its data 5 s later.
- ``replica-stop``: SIGSTOP a replica (a hang) while the learner publishes every step, SIGCONT it 10 s later.
- ``elastic``: the pool goes 1 -> 3 -> 1 mid-run (issue 30), driven by ``fleetrl run``'s controller
  (``deploy/run/autoscale.py``) on the learner's demand signal, not by the drill: a slow verifier on the first
  prompts starves the learner, the controller starts two replicas, each gets its weights from a peer (not the
  learner) and reaches the learner's version within 2 publishes; then the prompts are scored at once, the
  learner stops waiting and the controller drains one replica at a time (each finishes what it holds, 0 handed
  back, so 0 regenerated). The learner's bytes per version stay those of a fixed pool (no catch-up round).

Every drill has a bound on its wall time. Afterwards it accounts for every dataset position (issued,
trained exactly once, given up with a reason, lost), counts dead-lettered entries (all of them valid
work here) and recomputes every trained sample's reward from its response text and label (so a reward
invented during an outage shows). One table; exit code 1 if anything was lost, trained twice, dead-
lettered, rewarded wrongly, or hung past its bound. Options: ``python -m deploy.local.drills --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
import yaml

from deploy.local.drill_accounting import Accounting, account
from deploy.local.fleet import Fleet, FleetError
from deploy.local.sort_task import prepare_run
from deploy.local.zygote import Zygote
from shared import keys

RUN = "drill"
PROMPTS = 64
GROUPS_PER_STEP = 4
GROUP_SIZE = 4
CHECKPOINT_EVERY = 4
MAX_NEW_TOKENS = 6
REPLICAS = ("rollout-0", "rollout-1")


def say(msg: str) -> None:
    print(f"[drills {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class DrillTimeout(RuntimeError):
    """A drill's wait passed its bound."""


class DrillFailed(RuntimeError):
    """What a drill checks mid-run did not hold."""


CONTROL_TOKEN = "drill-" + secrets.token_hex(8)  # the fleet's control routes (/drain, /weights/*)


@dataclass
class Ctx:
    """What a drill's action gets: the fleet and a few waits, each bounded by the drill's deadline."""

    fleet: Fleet
    deadline: float
    notes: list[str] = field(default_factory=list)

    @property
    def learner_url(self) -> str:
        return self.fleet.services["learner"].url

    def status(self) -> dict | None:
        try:
            return httpx.get(f"{self.learner_url}/status", timeout=2.0).json()
        except (httpx.HTTPError, ValueError):
            return None

    def wait_until(self, what: str, predicate: Callable[[], bool], poll_s: float = 0.05) -> None:
        while not predicate():
            if time.monotonic() > self.deadline:
                raise DrillTimeout(f"timed out waiting for {what}")
            time.sleep(poll_s)

    def wait_step(self, low: int, high: int | None = None) -> int:
        """Wait until the learner's step is in [low, high]; returns it. A step past ``high`` (the learner went
        through the window between two polls) fails at once, naming the steps the polls saw."""
        seen: list[int] = []

        def ok() -> bool:
            st = self.status()
            step = st.get("step", -1) if st else -1
            if not seen or seen[-1] != step:
                seen.append(step)
            if high is not None and step > high:
                raise DrillFailed(f"the learner passed step {high} before a poll saw it in [{low}, {high}] "
                                  f"(steps seen, in order: {seen})")
            return step >= low

        try:
            self.wait_until(f"learner step in [{low}, {high}]", ok, poll_s=0.02)
        except DrillTimeout as exc:
            raise DrillTimeout(f"{exc} (steps seen, in order: {seen})") from None
        return seen[-1]

    def pending_on(self, consumer: str) -> int:
        r = redis.Redis.from_url(self.fleet.redis_url, socket_timeout=2)
        try:
            info = r.xpending(keys.prompts_stream(RUN), "rollout")
        except redis.RedisError:
            return 0
        finally:
            r.close()
        return next((int(c["pending"]) for c in info.get("consumers") or []
                     if c["name"] in (consumer, consumer.encode())), 0)

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, max(0.0, self.deadline - time.monotonic())))


# ---- the drills ----------------------------------------------------------------------------------------
def rollout_kill(ctx: Ctx) -> None:
    ctx.wait_step(2)
    ctx.wait_until("replica 0 to hold prompts", lambda: ctx.pending_on("rollout-0") > 0, poll_s=0.01)
    ctx.fleet.signal("rollout-0", signal.SIGKILL)
    ctx.notes.append(f"SIGKILL rollout-0 holding prompts at step {(ctx.status() or {}).get('step', '?')}")
    ctx.fleet.restart("rollout-0")


def learner_double_kill(ctx: Ctx) -> None:
    step = ctx.wait_step(CHECKPOINT_EVERY + 1, 2 * CHECKPOINT_EVERY - 1)
    ctx.fleet.signal("learner", signal.SIGKILL)
    ctx.notes.append(f"SIGKILL learner at step {step} (checkpoint {CHECKPOINT_EVERY})")
    ctx.fleet.restart("learner")
    step = ctx.wait_step(CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY - 1)
    ctx.fleet.signal("learner", signal.SIGKILL)
    ctx.notes.append(f"SIGKILL learner again at step {step}, before checkpoint {2 * CHECKPOINT_EVERY}")
    ctx.fleet.restart("learner")


def reward_outage(ctx: Ctx) -> None:
    ctx.wait_step(2)
    ctx.fleet.signal("reward", signal.SIGKILL)
    ctx.notes.append("reward service down for 30 s")
    ctx.sleep(30.0)
    ctx.fleet.restart("reward")


def redis_restart(ctx: Ctx) -> None:
    step = ctx.wait_step(3)
    server = ctx.fleet.redis_server
    assert server is not None
    server.kill()
    ctx.notes.append(f"SIGKILL Redis at step {step}; started again 5 s later")
    ctx.sleep(5.0)
    server.start()


def replica_stop(ctx: Ctx) -> None:
    step = ctx.wait_step(3)
    ctx.fleet.signal("rollout-0", signal.SIGSTOP)
    ctx.notes.append(f"SIGSTOP rollout-0 at step {step} for 10 s")
    try:
        ctx.sleep(10.0)
    finally:
        ctx.fleet.signal("rollout-0", signal.SIGCONT)


def _weights(ctx: Ctx, name: str) -> dict:
    r = httpx.get(f"{ctx.fleet.services[name].url}/weights/version",
                  headers={"Authorization": f"Bearer {CONTROL_TOKEN}"}, timeout=5)
    r.raise_for_status()
    return r.json()


def _control(ctx: Ctx, name: str, path: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(f"{ctx.fleet.services[name].url}{path}", json=body or {},
                      headers={"Authorization": f"Bearer {CONTROL_TOKEN}"}, timeout=10)


# The elastic drill's load: its first ELASTIC_SLOW_ROWS prompts go to a slow verifier (a third scorer that gives 0.0
# after SLOW_VERIFIER_S per answer), so one replica keeps the learner waiting and the pool grows to 3; the rest are
# scored at once, three replicas outrun the learner and the pool shrinks back to 1, one drain at a time.
ELASTIC_PROMPTS = 10 * PROMPTS
ELASTIC_SLOW_ROWS = 12 * GROUPS_PER_STEP
SLOW_VERIFIER_S = 2.0
ELASTIC_MAX = 3
ELASTIC_COOLDOWN_UP_S = 600.0  # longer than the drill's bound: one growth per run (see elastic())
SLOW_SCORER = {"name": "slow-verifier", "kind": "python", "function": "deploy.local.drills:slow_verifier",
               "signature": "verl", "max_workers": 256, "timeout_s": 30.0}


async def slow_verifier(*, data_source: str, solution_str: str, ground_truth: object, extra_info: object) -> float:
    """The elastic drill's slow verifier (verl signature): 0.0 for every answer, after its row's
    ``extra_info.delay_s`` seconds (a verifier that is slow on the run's first prompts only)."""
    import asyncio

    delay = float(extra_info.get("delay_s", 0.0)) if isinstance(extra_info, dict) else 0.0
    await asyncio.sleep(delay)
    return 0.0


ROUND = re.compile(r"weight round \d+ \(version (\d+)\): loaded")


def elastic_rows(rows: list[dict]) -> list[dict]:
    return [{**r, "extra_info": {"delay_s": SLOW_VERIFIER_S}} if i < ELASTIC_SLOW_ROWS else r
            for i, r in enumerate(rows)]


PACE_SCORE_S = 2.0  # the step drills' scoring time per answer: the learner's pace (see DRILLS)


def paced_rows(rows: list[dict]) -> list[dict]:
    return [{**r, "extra_info": {"delay_s": PACE_SCORE_S}} for r in rows]


def elastic(ctx: Ctx) -> None:
    """``fleetrl run``'s controller (``deploy/run/autoscale.py``) drives the pool from the learner's signal; the drill
    only watches: each joiner's first weights come from a peer and it is level with the learner within 2
    publishes, each drained replica hands nothing back, and the pool goes 1 -> 3 -> 1."""
    from deploy.run.autoscale import Autoscaler
    from deploy.run.plan import ProcessPlan
    from deploy.run.spec import RolloutPoolSpec
    from shared.ports import free_port

    base = ctx.fleet.services["rollout-0"]
    config = yaml.safe_load(base.config_path.read_text())
    plans = [ProcessPlan("rollout-0", "rollout", config)]
    for i in range(1, ELASTIC_MAX):
        plans.append(ProcessPlan(f"rollout-{i}", "rollout", {
            **config, "port": free_port(), "worker": {**config["worker"], "consumer_name": f"rollout-{i}"}}))
    # cooldown_up_s past the drill's bound: the pool grows once (the first growth has no change before it). Once the
    # slow prompts are done, one fast replica still starves the tiny learner >= 95 % on a loaded machine (96 % with
    # a second drill beside it), so the controller rightly grew the pool again (1 -> 3 -> 2 -> 1 -> 3 -> 2 -> 1),
    # and had that landed at the end of the data the run would have ended at 3
    pool = RolloutPoolSpec(min=1, max=ELASTIC_MAX, cooldown_up_s=ELASTIC_COOLDOWN_UP_S, cooldown_down_s=1,
                           down_stable_s=1, drain_timeout_s=20)
    scaler = Autoscaler(pool, plans, ctx.fleet, ctx.fleet.redis_url, RUN, CONTROL_TOKEN, lambda m: say(f"elastic: {m}"))
    learner = ctx.fleet.services["learner"]
    sizes = [1]  # the pool's size after each change
    # every join: (replica, where its log stood when it was started, the learner's version when it joined). A replica
    # started again appends to the same log, so each join's rounds are read from its own start on
    joined: list[tuple[str, int, int]] = []
    log_at: dict[str, int] = {}  # replica -> its log's size when it was last started
    seen = 0
    try:
        while learner.alive:
            if time.monotonic() > ctx.deadline:
                raise DrillTimeout(f"the run did not finish; pool changes: {[c['action'] for c in scaler.changes]}")
            scaler.tick()
            running = len(scaler._running())
            if running != sizes[-1]:
                sizes.append(running)
            for change in scaler.changes[seen:]:
                seen += 1
                name = change["replica"]
                if change["action"] == "joined":
                    at_join = (ctx.status() or {}).get("weight_version", 0)
                    first = _weights(ctx, name)["first_update"]
                    if not first or first["source"] != "peer":
                        raise DrillFailed(f"{name}'s first weights did not come from a peer: {first}")
                    ctx.notes.append(f"{name} joined with v{first['version']} from peer {first['peer']} "
                                     f"(learner on v{at_join})")
                    joined.append((name, log_at.get(name, 0), at_join))
                if change["action"] in ("start", "replace"):
                    log = ctx.fleet.run_dir / "logs" / f"{name}.log"
                    log_at[name] = log.stat().st_size if log.exists() else 0
                if change["action"] in ("start", "drain"):
                    ctx.notes.append(f"{change['action']} {name} at step {(ctx.status() or {}).get('step', '?')}: "
                                     f"{change['reason'][:90]}")
            time.sleep(0.2)
    finally:
        scaler.close()
    ctx.notes.append("pool sizes: " + " -> ".join(map(str, sizes)))
    for name, offset, at_join in joined:
        # the first ordinary round it loaded after its peer's weights: the learner had just published that version,
        # so from then on the joiner is on the learner's current version (the log says it exactly; a poll of both
        # versions races the learner's next publish)
        with open(ctx.fleet.run_dir / "logs" / f"{name}.log", "rb") as f:
            f.seek(offset)
            log = f.read().decode(errors="replace")
        first = ROUND.search(log)
        if first is None or int(first.group(1)) - at_join > 2:
            weights = [x[:200] for x in log.splitlines() if "weight" in x][:12]
            raise DrillFailed(f"{name} was not on the learner's version within 2 publishes of joining (learner on "
                              f"v{at_join} then): first round {first and first.group(0)!r}; its weight lines since "
                              f"its start: {weights}")
        ctx.notes.append(f"{name} level with the learner on v{first.group(1)} (v{at_join} when it joined)")
    if max(sizes) != ELASTIC_MAX or sizes[-1] != 1:
        raise DrillFailed(f"the pool went {' -> '.join(map(str, sizes))}, not 1 -> {ELASTIC_MAX} -> 1: "
                          f"{[(c['action'], c['replica'], c['reason'][:80]) for c in scaler.changes]}")
    for change in scaler.changes:
        if change["action"] == "left":
            log = ctx.fleet.run_dir / "logs" / f"{change['replica']}.log"
            line = next((x for x in reversed(log.read_text().splitlines()) if "drained:" in x), "")
            ctx.notes.append(f"{change['replica']} drained: {line.split('drained: ', 1)[-1] or 'no drain line'}")
            if " 0 handed back" not in line:
                raise DrillFailed(f"{change['replica']} handed prompts back (they would be regenerated): {line!r}")
    published = [x for x in learner.log_tail(2_000_000).splitlines() if "published version" in x]
    sizes_mb = {x.split("(", 1)[1].split(" MB", 1)[0] for x in published}
    if len(sizes_mb) != 1 or "caught up" in learner.log_tail(2_000_000):
        raise DrillFailed(f"the learner's bytes per version changed with the pool, or it ran a catch-up round: "
                          f"{sorted(sizes_mb)} MB")
    ctx.notes.append(f"learner published {len(published)} versions of {sizes_mb.pop()} MB each, no catch-up round")


@dataclass(frozen=True)
class Drill:
    name: str
    action: Callable[[Ctx], None]
    bound_s: float  # the whole drill, fleet start-up included
    replicas: tuple[str, ...] = REPLICAS  # started with the fleet
    prompts: int = PROMPTS  # dataset rows (one epoch): a longer run where the drill needs the time
    worker: dict = field(default_factory=dict)  # the replicas' worker settings the drill changes
    learner: dict = field(default_factory=dict)  # the learner's settings the drill changes
    scorers: tuple[dict, ...] = ()  # scorers the reward service adds (each must add 0.0: rewards are rechecked)
    rows: Callable[[list[dict]], list[dict]] | None = None  # the drill's own fields on the dataset rows


DRILLS = {d.name: d for d in (
    # every drill that acts at a learner step is paced (PACE_SCORE_S per answer): unpaced, a fleet whose rollout shares
    # each prompt's prefill and scores a round in one request trained all 16 steps in under a second, before the
    # drill's first /status poll (redis-restart then timed out on "steps seen: [-1]")
    Drill("rollout-kill", rollout_kill, 240, scorers=(SLOW_SCORER,), rows=paced_rows),
    # each answer scored after PACE_SCORE_S (a slow verifier's sleep, no CPU): the tiny learner trains a step in ~0.05 s
    # and, fed from a full window, went through 12 steps in 0.75 s, so under load a /status poll could miss the
    # 3-step kill windows; paced, two replicas (4 groups each in flight) deliver 2 steps per >= 2 s, so each window stays
    # open >= ~2 s however idle or busy the machine (at 1 s: steps 5, 6 | 7, 8 came 0.2 | 1.1 | 0.2 s apart). Its bound
    # stays under pytest-timeout's 300 s: a hang is the drill's own error, its fleet stopped (at 300 pytest killed the
    # test first and left the fleet running)
    Drill("learner-double-kill", learner_double_kill, 240, scorers=(SLOW_SCORER,), rows=paced_rows),
    Drill("reward-outage", reward_outage, 270, scorers=(SLOW_SCORER,), rows=paced_rows),
    Drill("redis-restart", redis_restart, 240, scorers=(SLOW_SCORER,), rows=paced_rows),
    Drill("replica-stop", replica_stop, 270, scorers=(SLOW_SCORER,), rows=paced_rows),
    # the pool goes 1 -> 3 -> 1 on the learner's signal; the first prompts' slow verifier starves the learner. The
    # tiny learner trains a step in ~0.02 s, faster than any number of hf replicas on 2 cores deliver one, so it
    # always waits some: the band says how much waiting is fine (grow at 95 %, shrink at 65 %); the slow verifier
    # makes it ~97 % on one replica, three fast ones 34-56 %, one fast 60-90 % (0.85 made the pool grow back at
    # the end of one run). Each replica takes 2 groups at a time: the signal grows the pool only by the replicas
    # that would find prompts waiting (window 8: with concurrency 4 one replica holds 4 and 4 wait, so only a
    # second would take work; with 2, 6 wait and three replicas each find some)
    Drill("elastic", elastic, 240, replicas=("rollout-0",), prompts=ELASTIC_PROMPTS, scorers=(SLOW_SCORER,),
          worker={"concurrency": 2},
          rows=elastic_rows, learner={"pool": {"window_steps": 4, "min_steps": 2, "wait_high": 0.95,
                                               "wait_low": 0.65, "max_wait_share": 0.98},
                                      # the last slow prompts share the learner's window with the first fast ones,
                                      # which step the learner twice in one slow scoring: each went stale on every
                                      # attempt and was given up after 50 (docs/elastic.md, "Why the drill failed")
                                      "rollout": {"stale_hold_s": 30.0}}),
)}


# ---- one fleet per drill -------------------------------------------------------------------------------
# Run-wide (every service holds the same, else the later ones refuse to start): a stopped worker's prompts are
# reclaimed after 3 s, not 30, so the drills stay short.
RUN_WIDE = {"max_staleness": 1, "prompt_claim_idle_ms": 3000}


def _learner_config(run: Path, model: Path) -> dict:
    return {
        "run_name": RUN, "run_dir": str(run / "learner"), "model": {"actor": str(model)},
        "algorithm": {"name": "grpo"},
        "optim": {"actor_lr": 1e-4, "schedule": "constant", "warmup_ratio": 0.0},
        "train": {"groups_per_step": GROUPS_PER_STEP, "micro_batch_size": 16, "torch_threads": 1},
        "run": RUN_WIDE,
        "rollout": {"group_size": GROUP_SIZE, "window": 2 * GROUPS_PER_STEP,
                    "sampling": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0}},
        "data": {"path": str(run / "data" / "drill.jsonl"), "input_key": "input", "label_key": "label",
                 "shuffle": False},
        "publish": {"every": 1, "sync": {"collective_timeout_s": 4.0, "regroup_timeout_s": 3.0,
                                         "load_timeout_s": 15.0}},
        "checkpoint": {"every": CHECKPOINT_EVERY},
        "observability": {"progress_bar": False, "plot": False, "log_sample_ids": True, "log_samples": True},
    }


def _rollout_config(model: Path, reward_url: str, consumer: str) -> dict:
    return {
        "run_name": RUN, "model": str(model),
        "engine": {"kind": "hf", "device": "cpu", "max_batch_size": 64, "torch_threads": 1},
        "run": RUN_WIDE,
        "worker": {"enabled": True, "reward_url": reward_url, "concurrency": 4,
                   "consumer_name": consumer, "reward_backoff_max_s": 2.0,
                   "sampling": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0}},
    }


# Exact answer plus a length penalty: the penalty varies with every response, so a reward made up during
# an outage (a 0.0, a copy) cannot pass the recomputation by chance.
EXACT = {"type": "exact"}
LENGTH = {"type": "length", "max_length": 2, "unit": "chars", "penalty": 1.0}
REWARD_CONFIG = {"scorers": [{"name": "exact", "kind": "rule", "check": EXACT},
                             {"name": "brevity", "kind": "rule", "check": LENGTH}]}


def recompute_reward(response: str | None, label: object) -> float:
    """The reward the reward service gives for this response, computed here with the same rules."""
    from services.reward.scorer_config import ExactCheck, LengthCheck
    from services.reward.scorers.rule import exact_match, length_penalty
    from shared.reward_api import ScoreItem

    item = ScoreItem(prompt="", response=response or "", label=label)
    return exact_match(ExactCheck(**EXACT), item) + length_penalty(LengthCheck(**LENGTH), item)


@dataclass
class DrillResult:
    name: str
    wall_s: float
    bound_s: float
    accounting: Accounting | None
    error: str | None
    notes: list[str]

    @property
    def ok(self) -> bool:
        return self.error is None and self.accounting is not None and self.accounting.ok


def run_drill(drill: Drill, root: Path, model: Path, rows: list[dict], redis_url: str | None = None) -> DrillResult:
    rows = rows[:drill.prompts]
    if drill.rows is not None:
        rows = drill.rows(rows)
    run = root / drill.name
    (run / "data").mkdir(parents=True, exist_ok=True)
    (run / "data" / "drill.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    t0 = time.monotonic()
    ctx = None
    error = None
    # the services (and the learner each time a drill restarts it) forked from one set of imports, as fleetrl
    # run's are: a restart is then a fork, not ~3 CPU-seconds of imports beside the fleet it must catch up with
    fleet = Fleet(run_dir=run, redis_url=redis_url, zygote=Zygote.for_run(str(model), run))
    try:
        fleet.start_redis()
        # every service starts side by side (start-up is mostly imports and model loading); then all healthy
        reward = fleet.start("reward", "services.reward",
                             {"scorers": [*REWARD_CONFIG["scorers"], *drill.scorers]}, wait=False)
        key = {"run_key": secrets.token_hex(32)}  # the fleet signs its queue records, as fleetrl run's does
        for i, name in enumerate(drill.replicas):
            cfg = _rollout_config(model, reward.url, f"rollout-{i}")
            cfg["worker"].update(drill.worker)
            fleet.start(name, "services.rollout", {**cfg, **key, "control_token": CONTROL_TOKEN}, wait=False)
        learner = _learner_config(run, model)
        for section, values in drill.learner.items():  # a drill's section adds to (or overrides) the base's
            learner[section] = {**learner[section], **values} if isinstance(learner.get(section), dict) else values
        fleet.start("learner", "services.learner", {**learner, **key}, wait=False)
        for name in ("reward", *drill.replicas, "learner"):
            fleet.wait_healthy(name)
        ctx = Ctx(fleet=fleet, deadline=t0 + drill.bound_s)
        say(f"{drill.name}: fleet up in {time.monotonic() - t0:.0f}s")
        drill.action(ctx)
        learner = fleet.services["learner"]
        ctx.wait_until("the learner to finish", lambda: not learner.alive, poll_s=0.2)
        if learner.proc.returncode != 0:
            error = f"learner exited {learner.proc.returncode}: {learner.log_tail(600)}"
    except (DrillTimeout, DrillFailed, FleetError, httpx.HTTPError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:800]
    wall = time.monotonic() - t0
    accounting = None
    try:
        accounting = _account(fleet, run, rows)
    except Exception as exc:  # noqa: BLE001 - reported in the table, never a traceback
        error = error or f"accounting failed: {type(exc).__name__}: {exc}"
    finally:
        fleet.stop_all()
    return DrillResult(drill.name, wall, drill.bound_s, accounting, error, ctx.notes if ctx else [])


def _account(fleet: Fleet, run: Path, rows: list[dict]) -> Accounting:
    ckpts = sorted((run / "learner" / "checkpoints").glob("step-*"))
    run_state = json.loads((ckpts[-1] / "run_state.json").read_text()) if ckpts else {}
    dead: list[dict[str, str]] = []
    if fleet.redis_server is not None and not fleet.redis_server.running:
        fleet.redis_server.start()
    r = redis.Redis.from_url(fleet.redis_url, socket_timeout=5, decode_responses=False)
    try:
        for stream in (keys.prompts_stream(RUN), keys.experiences_stream(RUN)):
            for _eid, f in r.xrange(keys.dead_letter_stream(stream)):
                dead.append({"stream": stream, "error": f.get(b"error", b"").decode(errors="replace")})
    finally:
        r.close()
    return account(positions=[f"e0-{i}" for i in range(len(rows))], group_size=GROUP_SIZE,
                   metrics_jsonl=run / "learner" / "metrics.jsonl", samples_jsonl=run / "learner" / "samples.jsonl",
                   run_state=run_state, dead_letters=dead, reward_of=recompute_reward)


# ---- the table -----------------------------------------------------------------------------------------
COLUMNS = ("drill", "wall s", "bound s", "issued", "trained once", "trained twice", "given up", "lost",
           "dead-lettered", "rewards checked", "rewards wrong", "result")


def table(results: list[DrillResult]) -> str:
    rows = [COLUMNS]
    for res in results:
        a = res.accounting
        nums = ((a.issued, a.trained_once, a.trained_twice, a.dead_lettered, a.lost, a.valid_dead_lettered,
                 a.rewards_checked, a.rewards_wrong) if a else ("-",) * 8)
        rows.append((res.name, f"{res.wall_s:.0f}", f"{res.bound_s:.0f}", *map(str, nums),
                     "ok" if res.ok else "FAILED"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make drills", description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=sorted(DRILLS), help="run only these drills (repeatable)")
    ap.add_argument("--run-dir", type=Path, default=None, help="default: runs/drills-<time>")
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or None,
                    help="an external Redis (default: $REDIS_URL; unset: an embedded server per drill; the "
                         "Redis drills need an embedded one)")
    args = ap.parse_args(argv)
    root = (args.run_dir or Path("runs") / time.strftime("drills-%Y%m%d-%H%M%S")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    _, _, model = prepare_run(root, seed=0, heldout=max(d.prompts for d in DRILLS.values()), hidden_size=64, layers=2)
    rows = [json.loads(x) for x in (root / "data" / "heldout.jsonl").read_text().splitlines()]
    results = []
    for name in args.only or list(DRILLS):
        say(f"drill {name} (bound {DRILLS[name].bound_s:.0f}s)")
        res = run_drill(DRILLS[name], root, model, rows, args.redis_url)
        say(f"{name}: {'ok' if res.ok else 'FAILED'} in {res.wall_s:.0f}s; " + "; ".join(res.notes))
        if res.error:
            say(f"{name}: {res.error}")
        for line in (res.accounting.details if res.accounting else [])[:12]:
            say(f"{name}:   {line}")
        results.append(res)
    text = table(results)
    print()
    print(text)
    (root / "drills.md").write_text(text + "\n")
    print(f"\nlogs under {root}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

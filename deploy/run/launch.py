"""``fleetrl run``: the whole fleet of one run spec on this machine, with one progress display.

Order: (embedded) Redis -> checks that need it (a used run name, ``--reset``) -> reward replicas, rollout
replicas and the learner side by side -> held-out accuracy of the starting policy (a fresh run with
``eval.data``; the learner loads meanwhile and holds its first step at its start gate until then). Then the
display follows the run until the learner exits; held-out accuracy every ``eval.every`` steps and at the end.
Ctrl-C (or SIGTERM) stops the learner first (it checkpoints at its step boundary), then the rest; the same
command resumes from the learner's last checkpoint (the embedded Redis keeps its data in ``run_dir/redis``).
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import yaml

from deploy.local.evaluate import RewardUnavailable
from deploy.local.fleet import Fleet, FleetError
from deploy.local.zygote import Zygote
from deploy.private_files import write_private
from services.learner.data import DataError, check_fields, epoch_plan, read_rows
from services.learner.rl.start_gate import open_start_gate
from services.learner.run_guard import clear_run, has_checkpoint, stale_run_problem
from services.learner.sft.plan import SFTPlan, sft_plan
from shared import keys
from shared.redact import redact_url
from shared.settings import SettingsError
from shared.training_health import check_health

from .autoscale import Autoscaler
from .display import Display, headline
from .heldout import episode_worker, evaluate, heldout_rows, next_eval_step
from .learner_ranks import follower_name, rank_envs
from .plan import RESOLVED_SPEC, RUN_KEY_FILE, ProcessPlan, plan, run_dir_of
from .preflight import (
    context_problem,
    extras_problems,
    path_problems,
    preflight,
    redis_problem,
    remote_problems,
)
from .progress import EvalPoint, Poller, RunView, SampleTail, fleet_error_line
from .reward_stall import RewardStall, before_after
from .run_record import RunLock, RunLocked, compare, latest_step, read_record, write_record
from .spec import RunSpec
from .summary import build_summary, heldout_points, read_summary

START_ORDER = {"rollout": 0, "learner": 1, "reward": 2}  # the order services start in (stable within a kind)
LEARNER_STOP_S = 180.0  # the learner finishes its step and checkpoints before it exits
FOLLOW_TICK_S = 0.5  # the display's refresh; the learner's exit ends a tick at once


class RunError(RuntimeError):
    """The run cannot start or failed; the message is what to show (one line per problem)."""


class RunDone(Exception):
    """Nothing is left to train (a finished run started again unchanged); the message says what to do."""


def _checkpoint_dir(learner: ProcessPlan) -> tuple[Path, bool]:
    ck = learner.config.get("checkpoint") or {}
    root = Path(ck["dir"]) if ck.get("dir") else Path(learner.config["run_dir"]) / "checkpoints"
    return root, bool(ck.get("resume", True))


class RunLauncher:
    def __init__(self, spec: RunSpec, spec_file: Path, display: Display, *, reset: bool = False,
                 zygote: Zygote | None = None, command: str | None = None, skip_preflight: bool = False) -> None:
        self.spec = spec
        #: the command the user ran (``--set`` included): every hint that says "run it again with ..." repeats it
        self.command = command or f"fleetrl run {spec_file}"
        self.skip_preflight = skip_preflight
        self._stall = RewardStall(spec.reward)
        self.zygote = zygote
        self.spec_file = spec_file
        self.display = display
        self.reset = reset
        self.run_dir = run_dir_of(spec)
        self.fleet: Fleet | None = None
        self.view = RunView(spec.run_name, algorithm=spec.algorithm.name)
        self._eval_thread: threading.Thread | None = None
        self._next_eval = 0
        self._autoscaler: Autoscaler | None = None  # an elastic rollout pool's controller (deploy/run/autoscale.py)
        self._eval_worker = None  # the rollout workers' settings when held-out prompts are agent episodes
        self._lock = RunLock(self.run_dir)
        self._resumed_step: int | None = None  # the checkpoint step a resumed run starts from
        self._learner_started = False
        self._resuming = False
        self._t0 = time.monotonic()
        self._said_health: set[str] = set()
        self._said_before: dict[str, str] = {}  # resumed: each warning the earlier launches said (summary.json)
        self._health_seen: dict[str, str] = {}  # every warning of the run, for summary.json
        self._reward_token: str | None = None  # the auth_token of the reward services this run started

    # ---- the run ----------------------------------------------------------------------------------------
    def run(self) -> int:
        # the services' imports start now (unless the caller started them sooner), once, in a zygote that forks
        # the services later (deploy/local/zygote.py), while this process checks the run
        zygote, self.zygote = self.zygote or Zygote.for_run(self.spec.model, self.run_dir), None
        try:  # first of all: a second fleetrl run of this run dir is refused at once
            self._lock.acquire(self.command)
        except RunLocked as exc:
            if zygote is not None:
                zygote.close()
            raise RunError(str(exc)) from exc
        try:
            # every path exists first: a missing model is the spec's `model:`, not a rollout setting's refusal
            problems = path_problems(self.spec, self.spec_file)
            if problems:
                raise RunError("\n".join(problems))
            checked = plan(self.spec, self.spec_file, "redis://127.0.0.1:1", "check")  # every setting valid
            problems = extras_problems(checked)  # every optional package a service needs is installed
            rollout = next((p for p in checked if p.kind == "rollout"), None)
            problems = problems or [p for p in [rollout and context_problem(self.spec, rollout.config)] if p]
            problems = problems or preflight(self.spec, self.spec_file)  # every function imports
            if not problems and not self.skip_preflight:  # every remote scorer answers a probe in its protocol
                problems = remote_problems(self.spec)
            if problems:
                raise RunError("\n".join(problems))
            self._check_data()
            self._check_record(*_checkpoint_dir(checked[-1]))
            self.view.total = self._step_budget()[0] or 0  # the display's step N/total before the learner answers
            resolved = self.spec.model_dump(mode="json")  # what the learner records in TensorBoard / wandb: no password
            resolved["redis"]["url"] = redact_url(resolved["redis"]["url"])
            (self.run_dir / RESOLVED_SPEC).write_text(yaml.safe_dump(resolved, sort_keys=False))
            self.fleet = Fleet(run_dir=self.run_dir, redis_url=self.spec.redis.url, zygote=zygote)
            zygote = None  # the fleet closes it
            try:
                return self._run(self.fleet)
            finally:
                self._stop(self.fleet)
                if self._learner_started:  # however it stopped: the step it checkpointed at, from its last line
                    self._read_final_metrics()
                if self._learner_started and self.spec.eval.data and self.spec.is_rl:
                    self._plot(checked[-1])  # however the run ended: the learner drew its curve without them
                if self._learner_started:
                    self._write_summary()
        finally:
            if zygote is not None:
                zygote.close()
            self._lock.release()

    def _check_record(self, ckpt_dir: Path, resume: bool) -> None:
        """A run that will resume continues only under the spec it was started with, or one whose budgets grew
        (:mod:`.run_record`); the spec is recorded for the next start."""
        new = self.spec.model_dump(mode="json")
        if not self.reset and resume and has_checkpoint(ckpt_dir):
            self._resumed_step = latest_step(ckpt_dir)
            self.view.step = self._resumed_step or 0  # not "step 0/..." while the learner loads its checkpoint
            old = read_record(self.run_dir)
            if old is not None:
                verdict = compare(old, new, str(self.spec_file), self.command)
                if not verdict.ok:
                    raise RunError(verdict.problem)
                for note in verdict.notes:
                    self.display.event(note)
            budget, name = self._step_budget()
            if budget is not None and self._resumed_step is not None and self._resumed_step >= budget:
                raise RunDone(f"nothing to train: the run in {self.run_dir} finished at step {self._resumed_step} "
                              f"of {budget}; raise {name} and it continues, or start over with "
                              f"{self.command} --reset")
        write_record(self.run_dir, new)

    def _step_budget(self) -> tuple[int | None, str]:
        """The step the learner stops at, where the spec says it outright, and the setting that says it."""
        if self.spec.is_rl:
            return self.spec.train.max_steps, "train.max_steps"
        rows = read_rows(self.spec.data.path, self.spec.data.split)
        steps = self._sft_plan(min(len(rows), self.spec.data.max_samples or len(rows))).total_steps
        a = self.spec.algorithm
        return steps, ("train.max_steps" if self.spec.train.max_steps or a.max_steps else "data.epochs")

    def _sft_plan(self, rows: int) -> SFTPlan:
        t = self.spec.train
        return sft_plan(self.spec.data, self.spec.algorithm, t.max_steps, "max_steps" in t.model_fields_set, rows)

    def _run(self, fleet: Fleet) -> int:
        spec, say = self.spec, self.display.event
        redis_url = None
        if spec.is_rl:
            redis_url = fleet.start_redis()
            problem = redis_problem(redis_url) if spec.redis.url is not None else None  # an external one answers
            if problem:
                raise RunError(problem)
            say(f"run {spec.run_name} in {self.run_dir}; Redis at {redact_url(redis_url)}")
        token = secrets.token_urlsafe(16)
        procs = plan(spec, self.spec_file, redis_url, token, self._run_key())
        self._reward_token = token if any(p.kind == "reward" for p in procs) else None  # held-out /score calls
        for p in procs:  # the reward services probe their remote scorers at start, unless the user said not to
            if p.kind == "reward" and self.skip_preflight:
                p.config["probe_remote_scorers"] = False
        learner = procs[-1]
        if spec.is_rl:
            self._eval_worker = episode_worker(next(p for p in procs if p.kind == "rollout").config)
            if spec.eval.data and self._eval_worker is not None and \
                    self._eval_worker.rollout_function == "openai_agent":
                raise RunError("eval.data: held-out evaluation of an openai_agent run is not supported (the agent "
                               "program picks its own sampling, so a greedy episode cannot be forced); set "
                               "eval.data: null, e.g. --set eval.data=null")
        ckpt_dir, resume = _checkpoint_dir(learner)
        if self.reset:
            self._reset(redis_url, Path(learner.config["run_dir"]), ckpt_dir)
        if redis_url is not None:
            problem = stale_run_problem(redis_url, spec.run_name, ckpt_dir, resume,
                                        reset_hint=f"{self.command} --reset (deletes it)")
            if problem:
                raise RunError(problem)
        resuming = self._resuming = resume and has_checkpoint(ckpt_dir)
        say(f"resuming from {ckpt_dir}" if resuming else "a fresh run")
        if not resuming:  # a fresh run's held-out history starts at its step 0, not after an earlier run's rows
            for stale in [self.run_dir / "eval.jsonl", *self.run_dir.glob("heldout_samples_step*.md")]:
                stale.unlink(missing_ok=True)
        else:
            self._resume_view()
        rows = heldout_rows(spec) if spec.eval.data and spec.is_rl else []  # preference runs: the learner's
        # a fresh run measures the starting policy before the learner moves it: the learner starts with the others
        # and loads meanwhile, held at its start gate until the evaluation is done (a resumed run has no gate:
        # replicas wait at start for the latest version, which the learner publishes)
        gate = secrets.token_hex(8) if rows and not resuming else None
        if gate is not None:
            learner.config.setdefault("train", {})["start_gate"] = gate
        pool = spec.replicas.pool
        standby = [p for p in procs if p.kind == "rollout" and int(p.name.rsplit("-", 1)[1]) >= spec.replicas.rollout_start]
        started = [p for p in procs if p not in standby]
        # the first step waits on the rollout replicas (engine, then generation) and the learner (prompts, then the
        # trainer); a reward service is up in a fraction of that: it starts last
        for p in sorted(started, key=lambda p: START_ORDER.get(p.kind, 0)):
            if p.kind == "learner":
                self._start_learner(fleet, p)
                continue
            say(f"starting {p.name} ({p.url})")
            fleet.start(p.name, p.module, p.config, wait=False)
        for p in started:
            if p.kind != "learner":
                fleet.wait_healthy(p.name)
        if pool is not None and redis_url is not None:
            self._autoscaler = Autoscaler(pool, [p for p in procs if p.kind == "rollout"], fleet, redis_url,
                                          spec.run_name, learner.config["control_token"], say)
            say(f"elastic rollout pool: {pool.min} to {pool.max} replicas, on the learner's demand signal")
        if gate is not None:
            self._evaluate(rows, step=0)
            open_start_gate(redis_url, keys.learner_start_gate(spec.run_name), gate)
        self._follow(fleet, rows)
        if spec.heldout_pairs:
            self._say_heldout_pairs()
        if rows and (not self.view.evals or self.view.evals[-1].step != self.view.step):
            self._wait_for_final_weights(fleet)
            self._evaluate(rows, step=self.view.step)
        if len(self.view.evals) >= 2:  # the whole run's: a resumed run's earlier launches included
            earlier = (read_summary(self.run_dir / "summary.json") or {}) if self._resuming else {}
            say(before_after(self.view.evals, float(earlier.get("wall_time_s") or 0) + time.monotonic() - self._t0))
        return 0

    def _say_heldout_pairs(self) -> None:
        """A preference run's held-out pairwise accuracy, first and last point (the learner measured them)."""
        from services.learner.preference.runner import heldout_line

        path = self.run_dir / "learner" / "heldout_pairs.jsonl"
        points = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
        line = heldout_line(points)
        if line:
            self.display.event(line)

    def _start_learner(self, fleet: Fleet, p: ProcessPlan) -> None:
        """Rank 0 as ``learner``, ranks 1..N-1 beside it (:mod:`.learner_ranks`), all with the same settings."""
        envs = rank_envs(self.spec.replicas.learner)
        ranks = f", rank 0 of {len(envs)}" if len(envs) > 1 else ""
        self.display.event(f"starting {p.name} ({p.url}{ranks})")
        fleet.start(p.name, p.module, p.config, wait=False, env=envs[0] or None)
        self._learner_started = True
        for rank, env in enumerate(envs[1:], start=1):
            fleet.start(follower_name(rank), p.module, p.config, wait=False, env=env)
        if len(envs) > 1:
            self.display.event(f"starting learner ranks 1 to {len(envs) - 1} ({follower_name(1)} ...), following "
                               f"{p.name}")

    def _run_key(self) -> str:
        """The run's signing key: read from ``run_dir/run_key`` (a resumed run keeps it: records in flight stay
        valid), else generated there (0600)."""
        path = self.run_dir / RUN_KEY_FILE
        key = path.read_text().strip() if path.is_file() else ""
        if len(key) < 16:
            key = secrets.token_hex(32)
            write_private(path, key + "\n")
        return key

    def _plot(self, learner: ProcessPlan) -> None:
        """The learner's reward curve again, now with the held-out accuracy of every evaluation on it (the
        learner drew its own before the final evaluation)."""
        if not (learner.config.get("observability") or {}).get("plot", True):
            return
        learner_dir = Path(learner.config["run_dir"])
        try:
            from services.learner.observability import plot_reward_curve

            out = plot_reward_curve(learner_dir / "metrics.jsonl", learner_dir / "reward_curve.png",
                                    self.run_dir / "eval.jsonl")
        except Exception as exc:  # noqa: BLE001  (a picture must never fail a finished run)
            self.display.event(f"could not draw the reward curve: {exc}")
            return
        if out is not None:
            self.display.event(f"reward curve with held-out accuracy: {out}")

    def _follow(self, fleet: Fleet, rows: list[dict]) -> None:
        poller = Poller(fleet, self.spec.run_name)
        if self._autoscaler is not None:  # it replaces and drains rollout replicas: their exits are not the run's
            poller.managed = {p.name for p in self._autoscaler.plans}
        poller.view = self.view
        samples = SampleTail(self.run_dir / "learner" / "samples.jsonl")  # the learner's run_dir (plan.py)
        every = self.spec.eval.every or 0  # every N steps from step 0, a resumed run's included (not N after it)
        self._next_eval = next_eval_step(self._resumed_step or 0, every) if every else 0
        try:
            while True:
                if self._autoscaler is not None:
                    self._autoscaler.tick()
                view = poller.poll()
                self._health(view)
                self._reward_stalled(view)
                view.sample = samples.latest()
                self.display.update(view)
                learner = fleet.services["learner"]
                if not learner.alive:
                    self._read_final_metrics()
                    if learner.proc.returncode == 0:
                        self.display.event(f"learner finished: {headline(view)}")
                        if self._resumed_step is not None and view.step <= self._resumed_step:
                            self.display.event(
                                f"nothing was trained: the run had already finished at step {self._resumed_step}; "
                                f"raise train.max_steps (or data.epochs) and it continues, or start over with "
                                f"{self.command} --reset")
                        return
                    raise RunError(view.error or f"learner exited with code {learner.proc.returncode}")
                if view.error:
                    raise RunError(view.error)
                if rows and self.spec.eval.every and view.step >= self._next_eval > 0 and not self._evaluating():
                    self._next_eval = next_eval_step(view.step, self.spec.eval.every)
                    self._eval_thread = threading.Thread(target=self._evaluate, args=(rows, view.step), daemon=True)
                    self._eval_thread.start()
                _wait_for_exit(learner.proc, FOLLOW_TICK_S)  # a tick, cut short when the learner exits
        finally:
            poller.close()
            if self._autoscaler is not None:
                self._autoscaler.close()
            if self._eval_thread is not None:
                self._eval_thread.join(timeout=300)

    def _resume_view(self) -> None:
        """A resumed run's display (and health) goes on from the earlier launches' held-out points, and the
        warnings they said are not said again (the same points give the same warning; it was said at every
        resume)."""
        self.view.evals = [EvalPoint(int(p["step"]), float(p["accuracy"]), str(p.get("weight_version", "")),
                                     p.get("mean_reward"))
                           for p in heldout_points(self.run_dir / "eval.jsonl") if "accuracy" in p and "step" in p]
        self._said_before = dict((read_summary(self.run_dir / "summary.json") or {}).get("health") or {})

    def _health(self, view: RunView) -> None:
        """The run's health now (the learner's, and held-out accuracy's): each new warning said once."""
        heldout = check_health([], heldout=[(e.step, e.accuracy) for e in view.evals])
        view.health = {**view.learner_health, **{w.signal: w.message for w in heldout}}
        for what, message in view.health.items():
            if what not in self._said_health:
                self._said_health.add(what)
                if self._said_before.pop(what, None) != message:  # not what an earlier launch said already
                    self.display.event(f"health: {message}")
        self._said_health &= set(view.health)  # a warning that cleared is said again if it comes back
        self._health_seen.update(view.health)

    def _reward_stalled(self, view: RunView) -> None:
        """A scorer failing for ``reward.stall_after_s`` is said once (and shown while it lasts); one failing
        for ``reward.give_up_after_s`` stops the run (the learner checkpoints on the way out); one that answers
        again is said once too."""
        back = self._stall.came_back(view.reward_failing)
        if back:
            self.display.event(back)
        line, give_up = self._stall.check(view.reward_failing)
        if line and line.split(" for ", 1)[0] != (view.stalled or "").split(" for ", 1)[0]:
            self.display.event(line)
        view.stalled = line
        if give_up:
            raise RunError(f"{line}; gave up after reward.give_up_after_s = {self.spec.reward.give_up_after_s:g} s "
                           f"(the learner checkpoints; fix the scorer and run {self.command} to resume)")

    def _read_final_metrics(self) -> None:
        """The learner's last metrics line (its /status is gone with it): the step and version it ended at."""
        path = self.run_dir / "learner" / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        if not lines:
            return
        try:
            last = json.loads(lines[-1])
        except ValueError:
            return
        v = self.view
        v.step = int(last.get("step", v.step))
        v.weight_version = last.get("weight_version", v.weight_version)
        v.reward = last.get("reward_mean", v.reward)
        learner = self.fleet.services.get("learner") if self.fleet is not None else None
        if learner is not None:  # (after the fleet stopped, its services are gone: the phase was said already)
            v.phase = "finished" if learner.proc.returncode == 0 else "exited"

    # ---- evaluation -------------------------------------------------------------------------------------
    def _urls(self) -> tuple[str, str]:
        assert self.fleet is not None
        rollout = self.fleet.services["rollout-0"].url
        reward = self.fleet.services["reward-0"].url if "reward-0" in self.fleet.services else self.spec.reward.url
        return rollout, reward.rstrip("/")

    def _evaluating(self) -> bool:
        return self._eval_thread is not None and self._eval_thread.is_alive()

    def _evaluate(self, rows: list[dict], step: int) -> None:
        rollout, reward = self._urls()
        try:
            point = evaluate(rollout, reward, rows, step, self.spec.sampling.max_new_tokens,
                             self.run_dir / "eval.jsonl", worker=self._eval_worker, reward_token=self._reward_token,
                             success_threshold=self.spec.eval.success_threshold)
        except RewardUnavailable as exc:
            self.display.event(f"held-out evaluation at step {step} failed: {exc}")
            return
        except (httpx.HTTPError, RuntimeError) as exc:  # the rollout replica (a service of the run, named)
            said = str(exc).splitlines()[0] if str(exc) else ""
            if isinstance(exc, httpx.HTTPStatusError):  # its own words (raise_for_rollout)
                self.display.event(f"held-out evaluation at step {step} failed: {said}")
            else:
                self.display.event(f"held-out evaluation at step {step} failed: rollout-0: {type(exc).__name__}: "
                                   f"{said}")
            return
        self.view.evals.append(point)
        mean = "" if point.mean_reward is None else f", mean reward {point.mean_reward:.3f}"
        self.display.event(f"held-out accuracy at step {step}: {point.accuracy:.1%}{mean} "
                           f"({len(rows)} prompts, reward >= {self.spec.eval.success_threshold:g}; "
                           f"weights v{point.weight_version})")

    def _wait_for_final_weights(self, fleet: Fleet, timeout: float = 60.0) -> None:
        """The rollout replica serves the learner's last version before the final evaluation."""
        want = str(self.view.weight_version)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{fleet.services['rollout-0'].url}/health", timeout=2).json().get("weight_version") == want:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        self.display.event(f"rollout-0 did not reach weights v{want} within {timeout:.0f}s; evaluating what it serves")

    # ---- checks and housekeeping ------------------------------------------------------------------------
    def _check_data(self) -> None:
        try:
            rows = read_rows(self.spec.data.path, self.spec.data.split)
            if not rows:
                raise DataError(f"data.path {self.spec.data.path} holds no rows")
            if self.spec.heldout_pairs:
                self._check_pairs(rows)
            else:
                check_fields(rows, self.spec.data, need_output=not self.spec.is_rl)
            n = min(len(rows), self.spec.data.max_samples or len(rows))
            if self.spec.is_rl:
                note = epoch_plan(self.spec.data, self.spec.train.groups_per_step, self.spec.train.max_steps, n).note
            else:
                note = self._sft_plan(n).note
            if note:
                self.display.event(note)
            if self.spec.eval.data and not self.spec.heldout_pairs:
                heldout_rows(self.spec)
        except (DataError, ValueError, OSError) as exc:
            raise RunError(str(exc)) from exc

    def _check_pairs(self, rows: list[dict]) -> None:
        """Every training and held-out row of a preference run is a pair (one line naming the row otherwise)."""
        from services.learner.preference_data import pair_of_row, read_pairs

        a, data = self.spec.algorithm, self.spec.data
        margin = getattr(a, "margin_key", None)
        ref = (a.ref_chosen_key, a.ref_rejected_key) if getattr(a, "ref_chosen_key", None) else None
        for n, row in enumerate(rows):
            pair_of_row(row, n, data, str(data.path), margin, ref)
        if self.spec.eval.data:
            read_pairs(self.spec.eval.data, data, margin, ref, self.spec.eval.max_samples)

    def _reset(self, redis_url: str | None, learner_dir: Path, ckpt_dir: Path) -> None:
        if redis_url is not None:
            n = clear_run(redis_url, self.spec.run_name)
            self.display.event(f"--reset: deleted {n} Redis keys of run {self.spec.run_name}")
        for path in (ckpt_dir, learner_dir):
            if path.exists():
                shutil.rmtree(path)
                self.display.event(f"--reset: removed {path}")

    def _write_summary(self) -> None:
        """summary.json of the whole run (:mod:`.summary`): this launch added to what the earlier ones wrote."""
        v, path = self.view, self.run_dir / "summary.json"
        summary = build_summary(
            read_summary(path) if self._resuming else None, run_name=v.run_name, steps=v.step, total_steps=v.total,
            weight_version=v.weight_version, last_reward_mean=v.reward,
            heldout=heldout_points(self.run_dir / "eval.jsonl"), launch_s=time.monotonic() - self._t0,
            health=self._health_seen, metrics=str(self.run_dir / "learner" / "metrics.jsonl"),
            extra={"last_loss": v.loss} if not self.spec.is_rl else None)
        path.write_text(json.dumps(summary, indent=2))

    def _stop(self, fleet: Fleet) -> None:
        if "learner" in fleet.services and fleet.services["learner"].alive:
            self.display.event("stopping the learner (it checkpoints first)")
        fleet.stop("learner", timeout=LEARNER_STOP_S)
        fleet.stop_all()


def _wait_for_exit(proc, seconds: float) -> None:
    """Up to ``seconds``, less if ``proc`` (a service's ``Popen`` or forked process) exits meanwhile."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass


def run_spec(spec: RunSpec, spec_file: Path, display: Display, *, reset: bool = False,
             zygote: Zygote | None = None, command: str | None = None, skip_preflight: bool = False) -> int:
    """Run ``spec`` to the end; 0 done, 1 failed, 130 interrupted. Problems are shown on ``display``. ``zygote``:
    one the caller started as early as it could (:meth:`Zygote.for_run`); it is closed however the run ends."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if not stop.is_set():
            stop.set()
            raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    launcher = RunLauncher(spec, spec_file, display, reset=reset, zygote=zygote, command=command,
                           skip_preflight=skip_preflight)
    try:
        return launcher.run()
    except KeyboardInterrupt:
        display.event(f"interrupted: stopped; run the same command again to resume: {launcher.command}")
        return 130
    except RunDone as exc:
        display.event(str(exc))
        return 0
    except FleetError as exc:  # a service failed to start or died: what its log says, not the whole tail
        display.event(f"error: {fleet_error_line(exc, launcher.run_dir / 'logs')}")
        return 1
    except (RunError, SettingsError) as exc:
        for line in str(exc).splitlines() or [""]:
            display.event(f"error: {line}")
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        display.close()

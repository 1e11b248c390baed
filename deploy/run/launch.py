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
import threading
import time
from dataclasses import asdict
from pathlib import Path

import httpx
import yaml

from deploy.local.fleet import Fleet, FleetError
from services.learner.data import DataError, check_fields, epoch_plan, read_rows
from services.learner.run_guard import clear_run, has_checkpoint, stale_run_problem
from services.learner.start_gate import open_start_gate
from shared import keys
from shared.settings import SettingsError

from .display import Display, headline
from .heldout import episode_worker, evaluate, heldout_rows
from .plan import RESOLVED_SPEC, ProcessPlan, plan, run_dir_of
from .progress import Poller, RunView, first_error
from .spec import RunSpec

LEARNER_STOP_S = 180.0  # the learner finishes its step and checkpoints before it exits


class RunError(RuntimeError):
    """The run cannot start or failed; the message is what to show (one line per problem)."""


def _checkpoint_dir(learner: ProcessPlan) -> tuple[Path, bool]:
    ck = learner.config.get("checkpoint") or {}
    root = Path(ck["dir"]) if ck.get("dir") else Path(learner.config["run_dir"]) / "checkpoints"
    return root, bool(ck.get("resume", True))


class RunLauncher:
    def __init__(self, spec: RunSpec, spec_file: Path, display: Display, *, reset: bool = False) -> None:
        self.spec = spec
        self.spec_file = spec_file
        self.display = display
        self.reset = reset
        self.run_dir = run_dir_of(spec)
        self.fleet: Fleet | None = None
        self.view = RunView(spec.run_name)
        self._eval_thread: threading.Thread | None = None
        self._next_eval = 0
        self._eval_worker = None  # the rollout workers' settings when held-out prompts are agent episodes
        self._reward_token: str | None = None  # the auth_token of the reward services this run started

    # ---- the run ----------------------------------------------------------------------------------------
    def run(self) -> int:
        plan(self.spec, self.spec_file, "redis://127.0.0.1:1", "check")  # every setting valid before anything starts
        self._check_data()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / RESOLVED_SPEC).write_text(
            yaml.safe_dump(self.spec.model_dump(mode="json"), sort_keys=False))
        self.fleet = Fleet(run_dir=self.run_dir, redis_url=self.spec.redis.url)
        try:
            return self._run(self.fleet)
        finally:
            self._stop(self.fleet)

    def _run(self, fleet: Fleet) -> int:
        spec, say = self.spec, self.display.event
        redis_url = None
        if spec.is_rl:
            redis_url = fleet.start_redis()
            say(f"run {spec.run_name} in {self.run_dir}; Redis at {redis_url}")
        token = secrets.token_urlsafe(16)
        procs = plan(spec, self.spec_file, redis_url, token)
        self._reward_token = token if any(p.kind == "reward" for p in procs) else None  # held-out /score calls
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
                                        reset_hint=f"fleetrl run {self.spec_file} --reset (deletes it)")
            if problem:
                raise RunError(problem)
        resuming = resume and has_checkpoint(ckpt_dir)
        say(f"resuming from {ckpt_dir}" if resuming else "a fresh run")
        if not resuming:  # a fresh run's held-out history starts at its step 0, not after an earlier run's rows
            for stale in [self.run_dir / "eval.jsonl", *self.run_dir.glob("heldout_samples_step*.md")]:
                stale.unlink(missing_ok=True)
        rows = heldout_rows(spec) if spec.eval.data else []
        # a fresh run measures the starting policy before the learner moves it: the learner starts with the others
        # and loads meanwhile, held at its start gate until the evaluation is done (a resumed run has no gate:
        # replicas wait at start for the latest version, which the learner publishes)
        gate = secrets.token_hex(8) if rows and not resuming else None
        if gate is not None:
            learner.config.setdefault("train", {})["start_gate"] = gate
        for p in procs:
            say(f"starting {p.name} ({p.url})")
            fleet.start(p.name, p.module, p.config, wait=False)
        for p in procs[:-1]:
            fleet.wait_healthy(p.name)
        if gate is not None:
            self._evaluate(rows, step=0)
            open_start_gate(redis_url, keys.learner_start_gate(spec.run_name), gate)
        self._follow(fleet, rows)
        if rows and (not self.view.evals or self.view.evals[-1].step != self.view.step):
            self._wait_for_final_weights(fleet)
            self._evaluate(rows, step=self.view.step)
        if rows:
            self._plot(learner)
        self._write_summary()
        return 0

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
        poller.view = self.view
        self._next_eval = self.spec.eval.every or 0
        try:
            while True:
                view = poller.poll()
                self.display.update(view)
                learner = fleet.services["learner"]
                if not learner.alive:
                    self._read_final_metrics()
                    if learner.proc.returncode == 0:
                        say_done = f"learner finished: {headline(view)}"
                        self.display.event(say_done)
                        return
                    raise RunError(view.error or f"learner exited with code {learner.proc.returncode}")
                if view.error:
                    raise RunError(view.error)
                if rows and self.spec.eval.every and view.step >= self._next_eval > 0 and not self._evaluating():
                    self._next_eval = view.step + self.spec.eval.every
                    self._eval_thread = threading.Thread(target=self._evaluate, args=(rows, view.step), daemon=True)
                    self._eval_thread.start()
                time.sleep(0.5)
        finally:
            poller.close()
            if self._eval_thread is not None:
                self._eval_thread.join(timeout=300)

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
        v.phase = "finished" if self.fleet.services["learner"].proc.returncode == 0 else "exited"

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
                             self.run_dir / "eval.jsonl", worker=self._eval_worker, reward_token=self._reward_token)
        except (httpx.HTTPError, RuntimeError) as exc:
            self.display.event(f"held-out evaluation at step {step} failed: {exc}")
            return
        self.view.evals.append(point)
        self.display.event(f"held-out accuracy at step {step}: {point.accuracy:.1%} "
                           f"({len(rows)} prompts, weights v{point.weight_version})")

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
            check_fields(rows, self.spec.data, need_output=not self.spec.is_rl)
            if self.spec.is_rl:
                n = min(len(rows), self.spec.data.max_samples or len(rows))
                note = epoch_plan(self.spec.data, self.spec.train.groups_per_step, self.spec.train.max_steps, n).note
                if note:
                    self.display.event(note)
            if self.spec.eval.data:
                heldout_rows(self.spec)
        except (DataError, ValueError, OSError) as exc:
            raise RunError(str(exc)) from exc

    def _reset(self, redis_url: str | None, learner_dir: Path, ckpt_dir: Path) -> None:
        if redis_url is not None:
            n = clear_run(redis_url, self.spec.run_name)
            self.display.event(f"--reset: deleted {n} Redis keys of run {self.spec.run_name}")
        for path in (ckpt_dir, learner_dir):
            if path.exists():
                shutil.rmtree(path)
                self.display.event(f"--reset: removed {path}")

    def _write_summary(self) -> None:
        v = self.view
        summary = {"run_name": v.run_name, "steps": v.step, "total_steps": v.total, "weight_version": v.weight_version,
                   "last_reward_mean": v.reward, "heldout": [asdict(e) for e in v.evals],
                   "metrics": str(self.run_dir / "learner" / "metrics.jsonl")}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))

    def _stop(self, fleet: Fleet) -> None:
        if "learner" in fleet.services and fleet.services["learner"].alive:
            self.display.event("stopping the learner (it checkpoints first)")
        fleet.stop("learner", timeout=LEARNER_STOP_S)
        fleet.stop_all()


def run_spec(spec: RunSpec, spec_file: Path, display: Display, *, reset: bool = False) -> int:
    """Run ``spec`` to the end; 0 done, 1 failed, 130 interrupted. Problems are shown on ``display``."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if not stop.is_set():
            stop.set()
            raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    launcher = RunLauncher(spec, spec_file, display, reset=reset)
    try:
        return launcher.run()
    except KeyboardInterrupt:
        display.event("interrupted: stopped; run the same command again to resume")
        return 130
    except FleetError as exc:  # a service failed to start or died: what its log says, not the whole tail
        head, _, tail = str(exc).partition("\n")
        display.event(f"error: {head.rstrip(':')}: {first_error(tail)}")
        display.event(f"its log: {launcher.run_dir / 'logs'}")
        return 1
    except (RunError, SettingsError) as exc:
        for line in str(exc).splitlines() or [""]:
            display.event(f"error: {line}")
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        display.close()

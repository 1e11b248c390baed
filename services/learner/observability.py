"""Where a run's numbers go: Prometheus (own registry), metrics.jsonl, a tqdm bar, TensorBoard / wandb if
installed, and ``reward_curve.png`` at the end."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.learner.settings import ObservabilitySettings

log = logging.getLogger(__name__)

STEP_GAUGES = ("reward_mean", "reward_std", "kl", "entropy", "clip_frac", "actor_grad_norm", "critic_grad_norm",
               "policy_loss", "value_loss", "sft_loss", "tokens_per_s", "actor_lr", "is_weight_mean", "is_capped_frac",
               "is_rejected_frac", "mismatch_k3", "mismatch_abs_mean", "mismatch_abs_max", "staleness_mean",
               "response_len_mean", "step_time_s", "wait_time_s")
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32)
PUBLISH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class MetricsSink:
    def __init__(self, settings: ObservabilitySettings, run_dir: Path, registry: CollectorRegistry, *,
                 run_name: str | None = None, config: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self.run_name = run_name
        self.config = config  # the run's configuration for TensorBoard / wandb (observability.run_config wins)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.run_dir / "metrics.jsonl"
        self.samples_path = self.run_dir / "samples.jsonl"
        self.plot_path = self.run_dir / "reward_curve.png"
        self.step_gauges = {
            k: Gauge(f"fleetrl_learner_{k}", f"Last learner step's {k}", registry=registry) for k in STEP_GAUGES
        }
        self.step = Gauge("fleetrl_learner_step", "Learner steps done", registry=registry)
        self.version = Gauge("fleetrl_learner_weight_version", "Latest published weight version", registry=registry)
        self.counters = {
            name: Counter(f"fleetrl_learner_{name}", f"Learner {name.replace('_', ' ')}", registry=registry)
            for name in ("experiences_consumed", "experiences_deduplicated", "experiences_dropped_stale",
                         "experiences_rejected", "experiences_unissued", "experiences_unsigned", "prompts_issued", "prompts_reissued", "prompts_abandoned",
                         "samples_trained", "redis_outages", "publishes_failed", "groups_filtered",
                         "dynamic_sampling_cap_reached")
        }
        self.staleness = Histogram("fleetrl_learner_staleness", "Weight versions between generation and training",
                                   buckets=STALENESS_BUCKETS, registry=registry)
        self.in_flight = Gauge("fleetrl_learner_prompts_in_flight", "Prompt groups issued, not yet trained",
                               registry=registry)
        self.publish_seconds = Histogram("fleetrl_learner_publish_seconds", "Weight publishes, end to end",
                                         buckets=PUBLISH_BUCKETS, registry=registry)
        self.publish_phase = Gauge("fleetrl_learner_publish_phase_seconds", "Last weight publish's time per phase",
                                   ["phase"], registry=registry)
        self.round_bytes = Counter("fleetrl_weight_round_bytes", "Bytes weight rounds broadcast, by kind: full (every "
                                   "bucket whole), delta (patches against the confirmed base), adapter (a LoRA adapter only; "
                                   "docs/weight-sync.md)",
                                   ["kind"], registry=registry)
        self.changed_fraction = Gauge("fleetrl_weight_changed_fraction", "Share of the last published version's wire "
                                      "values that differ from the delta base (last delta plan)", registry=registry)
        self.round_estimate = Gauge("fleetrl_weight_round_estimate_seconds", "What a weight round of each kind (full, "
                                    "delta) is expected to take, from recent rounds: publish.sync.delta auto chooses "
                                    "the faster (docs/weight-sync.md)", ["kind"], registry=registry)
        self.delta_chosen = Gauge("fleetrl_weight_delta_chosen", "1 when the last published version was chosen to go "
                                  "as a delta round, 0 full (publish.sync.delta; docs/weight-sync.md)",
                                  registry=registry)
        self.publish_replicas = Gauge("fleetrl_learner_publish_replicas", "Replicas per outcome in the last publish",
                                      ["outcome"], registry=registry)
        self.version_span = Histogram("fleetrl_learner_version_span", "Weight versions one trained sample's tokens "
                                      "span (partial rollouts; 0 = one version made it)", buckets=STALENESS_BUCKETS,
                                      registry=registry)
        self.pool = Gauge("fleetrl_learner_pool", "The rollout pool's demand signal (docs/elastic.md): "
                          "desired_replicas, replicas, prompts_waiting, groups_in_flight, backlog, wait_share, "
                          "tokens_per_s_per_replica", ["field"], registry=registry)
        self.staleness_counts: dict[int, int] = {}
        self.version_span_counts: dict[int, int] = {}
        self._bar = None
        self._tb: Any = None  # a tensorboard SummaryWriter when observability.tensorboard is on (optional import)
        self._wandb = None

    # ---- lifecycle ---------------------------------------------------------------------------------
    def open(self, total_steps: int, initial_step: int) -> None:
        if self.settings.progress_bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=initial_step, desc="learner", unit="step", dynamic_ncols=True)
        if self.settings.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
            except ImportError:
                log.warning("observability.tensorboard is on but tensorboard is not installed; skipping it")
            else:
                config = self.run_config()
                if self.run_name:
                    self._tb.add_text("run_name", self.run_name, 0)
                if config is not None:
                    import yaml

                    text = yaml.safe_dump(config, sort_keys=False)
                    self._tb.add_text("config", "```yaml\n" + text + "```", 0)  # TensorBoard renders markdown
        if self.settings.wandb_project:
            try:
                import wandb

                self._wandb = wandb.init(project=self.settings.wandb_project, name=self.run_name,
                                         config=self.run_config(), dir=str(self.run_dir), resume="allow")
            except ImportError:
                log.warning("observability.wandb_project is set but wandb is not installed; skipping it")

    def run_config(self) -> dict[str, Any] | None:
        """The run's configuration: ``observability.run_config``'s file (fleetrl run's resolved spec) if it reads
        as a mapping, else the settings this sink was given."""
        path = self.settings.run_config
        if path:
            import yaml

            try:
                loaded = yaml.safe_load(Path(path).read_text())
            except (OSError, yaml.YAMLError) as exc:
                log.warning("observability.run_config %s cannot be read (%s); logging the learner's settings", path,
                            exc)
            else:
                if isinstance(loaded, dict):
                    return loaded
                log.warning("observability.run_config %s holds no mapping; logging the learner's settings", path)
        return self.config

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self.settings.plot:
            try:
                plot_reward_curve(self.jsonl_path, self.plot_path)
            except Exception:  # a plot must never fail a finished run
                log.exception("could not write %s", self.plot_path)

    # ---- per event ---------------------------------------------------------------------------------
    def count(self, name: str, n: int = 1) -> None:
        if name in self.counters and n:
            self.counters[name].inc(n)

    def observe_staleness(self, values: list[int]) -> None:
        for v in values:
            self.staleness.observe(v)
            self.staleness_counts[v] = self.staleness_counts.get(v, 0) + 1

    def observe_version_spans(self, values: list[int]) -> None:
        for v in values:
            self.version_span.observe(v)
            self.version_span_counts[v] = self.version_span_counts.get(v, 0) + 1

    def observe_pool(self, signal: Any) -> None:
        """The pool signal's numbers as gauges (``fleetrl_learner_pool{field="desired_replicas"}`` ...)."""
        for name in ("desired_replicas", "replicas", "prompts_waiting", "groups_in_flight", "backlog",
                     "wait_share", "tokens_per_s_per_replica", "learner_tokens_per_s"):
            self.pool.labels(name).set(float(getattr(signal, name)))

    def observe_publish(self, report: Any) -> dict[str, float]:
        """Record one publish (a :class:`~services.learner.weights.PublishReport`); the step metrics it adds."""
        self.publish_seconds.observe(report.seconds)
        for phase, seconds in report.phases.items():
            self.publish_phase.labels(phase).set(seconds)
        out = {"publish_s": round(report.seconds, 4)}
        for kind, n in getattr(report, "round_bytes", {}).items():
            self.round_bytes.labels(kind).inc(n)
            out[f"publish_bytes_{kind}"] = n
        if getattr(report, "changed_fraction", None) is not None:
            self.changed_fraction.set(report.changed_fraction)
            out["publish_changed_fraction"] = report.changed_fraction
        choice = getattr(report, "delta_choice", None)
        if choice is not None:
            chosen = 1 if choice["kind"] == "delta" else 0
            self.delta_chosen.set(chosen)
            out["publish_delta_chosen"] = chosen
            for kind in ("full", "delta"):
                if choice.get(f"{kind}_s") is not None:
                    self.round_estimate.labels(kind).set(choice[f"{kind}_s"])
                    out[f"publish_round_s_{kind}"] = choice[f"{kind}_s"]
        for outcome in ("loaded", "dropped", "refused"):
            n = len(getattr(report, outcome))
            self.publish_replicas.labels(outcome).set(n)
            out[f"publish_{outcome}"] = n
        return out

    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        self.step.set(step)
        for k, g in self.step_gauges.items():
            v = metrics.get(k)
            if isinstance(v, (int, float)) and math.isfinite(v):
                g.set(v)
        if "weight_version" in metrics:
            self.version.set(metrics["weight_version"])
        if self.settings.metrics_jsonl:
            with self.jsonl_path.open("a") as f:
                f.write(json.dumps({"time": time.time(), **metrics}) + "\n")
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        if self._bar is not None:
            self._bar.update(max(0, step - self._bar.n))
            shown = {k: f"{metrics[k]:.3g}" for k in ("reward_mean", "kl", "sft_loss", "loss", "rewards/accuracies",
                                                       "weight_version")
                     if isinstance(metrics.get(k), (int, float))}
            self._bar.set_postfix(shown, refresh=False)


    def log_samples(self, step: int, samples: list[Any]) -> None:
        """Trained samples to samples.jsonl, tagged with the step: every one with ``observability.log_samples``,
        else a few (:func:`pick_samples`) every ``observability.log_every`` steps (and at step 1), which also go to
        TensorBoard (a markdown table) and wandb (a table) when those are on."""
        o = self.settings
        if o.log_samples:
            chosen = list(samples)
        elif o.log_every and (step % o.log_every == 0 or step == 1):
            chosen = pick_samples(samples, o.samples_per_log)
        else:
            return
        rows = [sample_row(step, e) for e in chosen]
        with self.samples_path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        shown = rows if not o.log_samples else [sample_row(step, e) for e in pick_samples(samples, o.samples_per_log)]
        if self._tb is not None and shown:
            self._tb.add_text("samples", samples_markdown(shown), step)
        if self._wandb is not None and shown:
            import wandb

            columns = ["step", "prompt_text", "response_text", "reward", "response_tokens", "finish_reason"]
            self._wandb.log({"samples": wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in shown])},
                            step=step)


def sample_row(step: int, e: Any) -> dict[str, Any]:
    """One samples.jsonl line: a trained sample's prompt, completion, reward (and its components), length."""
    return {
        "step": step, "id": e.id, "group_id": e.group_id, "label": e.label,
        "prompt_text": e.prompt_text, "response_text": e.response_text, "reward": e.reward,
        "reward_components": e.reward_components, "weight_version": e.weight_version,
        "finish_reason": e.finish_reason, "response_tokens": len(e.response_token_ids),
        "created_at": e.created_at, "generated_at": e.generated_at,  # task issued, sample scored
    }


def pick_samples(samples: list[Any], n: int) -> list[Any]:
    """Up to ``n`` of ``samples``: the first of each prompt group first (different prompts), then the rest."""
    seen: set[str] = set()
    firsts: list[Any] = []
    rest: list[Any] = []
    for e in samples:
        (rest if e.group_id in seen else firsts).append(e)
        seen.add(e.group_id)
    return (firsts + rest)[:n]


def samples_markdown(rows: list[dict[str, Any]]) -> str:
    """``rows`` (:func:`sample_row`) as a markdown table (TensorBoard's text tab renders it)."""

    def cell(text: Any) -> str:
        return str(text).replace("|", "\\|").replace("\n", "\\n")[:500]

    lines = ["| prompt | completion | reward | tokens | finish |", "|---|---|---|---|---|"]
    lines += [f"| {cell(r['prompt_text'])} | {cell(r['response_text'])} | {r['reward']} | {r['response_tokens']} | "
              f"{r['finish_reason']} |" for r in rows]
    return "\n".join(lines)


def read_history(jsonl_path: Path) -> dict[int, dict]:
    """Metrics per step from metrics.jsonl; a step replayed after a crash keeps its latest line."""
    history: dict[int, dict] = {}
    if not jsonl_path.is_file():
        return history
    for line in jsonl_path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a crash
            continue
        if isinstance(row, dict) and "step" in row:
            history[int(row["step"])] = row
    return history


def read_heldout(eval_jsonl: Path | None) -> list[tuple[int, float]]:
    """``(step, accuracy)`` of each held-out evaluation in ``eval.jsonl`` (``fleetrl run``; the last per step)."""
    points: dict[int, float] = {}
    if eval_jsonl is None or not Path(eval_jsonl).is_file():
        return []
    for line in Path(eval_jsonl).read_text().splitlines():
        try:
            row = json.loads(line)
            points[int(row["step"])] = float(row["accuracy"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return sorted(points.items())


def plot_reward_curve(jsonl_path: Path, out_path: Path, eval_jsonl: Path | None = None) -> Path | None:
    """Reward mean (RL) or SFT loss per step, with a moving average, as a PNG (matplotlib Agg); with
    ``eval_jsonl``, the held-out accuracy of each evaluation on its own axis (0-100 %) on the same picture."""
    history = read_history(jsonl_path)
    key = "reward_mean" if any("reward_mean" in r for r in history.values()) else "sft_loss"
    points = sorted((s, r[key]) for s, r in history.items() if key in r)
    heldout = read_heldout(eval_jsonl)
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, values = zip(*points)
    window = max(1, len(values) // 10)
    smooth = [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1])
              for i in range(len(values))]
    fig, ax = plt.subplots(figsize=(7, 4))
    lines = ax.plot(steps, values, alpha=0.35, label=key)
    lines += ax.plot(steps, smooth, label=f"{key} (moving avg, {window})")
    ax.set_xlabel("learner step")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
    if heldout:
        acc_ax = ax.twinx()
        e_steps, accs = zip(*heldout)
        lines += acc_ax.plot(e_steps, [100 * a for a in accs], "o-", color="tab:green",
                             label="held-out accuracy (greedy, %)")
        acc_ax.set_ylim(0, 100)
        acc_ax.set_ylabel("held-out accuracy (%)")
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="lower right")
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path

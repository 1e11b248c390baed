"""The RL run's ``/status``: what the run owner and its parts hold, put together as one JSON object (the learner's
``GET /status`` adds the run name; ``fleetrl run`` and the launcher read it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any, Protocol

from services.learner.distributed.env import RankInfo
from services.learner.observability import MetricsSink
from services.learner.rl.commits import Commits
from services.learner.rl.group_buffer import GroupBuffer
from services.learner.run_state import RunState
from services.learner.settings import LearnerSettings
from services.learner.watches.pool import PoolWatch
from shared.experience_queue import StreamQueue
from shared.training_health import Peaks, check_health


class RunView(Protocol):
    """What ``/status`` reads of the RL run owner (``RLRunner``), and no more."""

    s: LearnerSettings
    phase: str
    error: str | None
    total_steps: int
    state: RunState
    buffer: GroupBuffer
    sink: MetricsSink
    experiences: StreamQueue
    commits: Commits
    ranks: RankInfo
    link: Any  # OwnerLink to the follower ranks (its replica_digests), or None
    peaks: Peaks
    pool: PoolWatch

    @property
    def trainer(self) -> Any: ...  # RLTrainer once loaded (its global_step), else None

    @property
    def publisher(self) -> Any: ...  # WeightPublisher once loaded, else None

    @property
    def picker(self) -> Any: ...  # BatchPicker once the run started (its holding()), else None

    @property
    def last_metrics(self) -> Mapping[str, Any]: ...  # read only: the owner's dict

    @property
    def recent(self) -> Iterable[dict[str, Any]]: ...  # the last steps' health metrics (read only: a deque)


def run_status(run: RunView) -> dict[str, Any]:
    st = run.state
    holding = run.picker.holding() if run.picker is not None and run.phase == "running" else None
    return {
        "phase": run.phase,
        **({"waiting": "the launcher's go to start (train.start_gate): fleetrl run is measuring the starting "
                       "policy on the held-out set"} if run.phase == "waiting_for_start_gate" else {}),
        **({"waiting": holding} if holding else {}),
        "error": run.error,
        "algorithm": run.s.algorithm.name,
        "step": run.trainer.global_step if run.trainer else 0,
        "total_steps": run.total_steps,
        "weight_version": st.weight_version,
        "epoch": st.epoch,
        "next_index": st.next_index,
        "prompts_in_flight": len(st.in_flight),
        "groups_buffered": len(run.buffer),
        "groups_complete": len(run.buffer.complete),
        "counters": dict(st.counters),
        "staleness_histogram": {str(k): v for k, v in sorted(run.sink.staleness_counts.items())},
        "version_span_histogram": {str(k): v for k, v in sorted(run.sink.version_span_counts.items())},
        "abandoned": dict(list(st.abandoned.items())[-5:]),
        "records_signed": run.experiences.signer is not None,  # run_key set: unsigned entries are dead-lettered
        "last_checkpoint": run.commits.last_checkpoint,
        "ranks": run.ranks.world_size,
        "replica_digests": run.link.replica_digests if run.link is not None else [],
        "last_metrics": {k: v for k, v in run.last_metrics.items() if k != "sample_ids"},
        "health": [asdict(w) for w in check_health(list(run.recent), peaks=run.peaks)],
        "last_publish": publish_status(run.publisher),
        "pool": run.pool.last.to_dict() if run.pool.last is not None else None,
    }


def publish_status(publisher: Any) -> dict[str, Any] | None:
    """The last weight publish: version, seconds, phases, replicas per outcome, and who waits for the next."""
    report = publisher.last_report if publisher is not None else None
    if report is None:
        return None
    return {"version": report.version, "seconds": round(report.seconds, 4), "phases": report.phases,
            "loaded": report.loaded, "dropped": report.dropped, "refused": report.refused,
            "rounds": report.rounds, "errors": report.errors[-3:],
            "replicas_waiting": publisher.replicas_waiting,
            "failed_in_a_row": publisher.history.failed_in_a_row}

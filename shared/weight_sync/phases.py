"""Where one weight update spends its time, by step (publisher and replicas report them; benchmarks print them)."""

from __future__ import annotations

import time


class PhaseClock:
    """Where a publish spends its time: ``lap(name)`` adds the time since the previous lap to ``phases[name]``.

    Publisher (``PublishReport.phases``): ``plan`` (version, tensors, bucket plan), ``manifest`` (manifest
    written, replicas listed), ``announce`` (round id, rendezvous, announcement), ``group`` (forming a group),
    ``send`` (every bucket broadcast and digested), ``settle`` (waiting for the members' reports), ``finish``
    (retained copies, checksums, version key). An hf replica (its sidecar's ``last_update``): ``receive``
    (buckets received and digested), ``verify`` (the publisher's checksums read and compared), ``apply``
    (generation paused, weights switched)."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._last
        self._last = now

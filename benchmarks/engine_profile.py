"""Where an hf engine's time goes, for benchmarks: ``with EngineProfile(engine) as prof: ...; print(prof.report())``.

Wraps (on this one engine's decode loop, for the duration of the block) the loop's phases with timers: prefill
(tokens fed, forward passes), decode steps (rows x cache width), cache bookkeeping (merge / keep), sampling and
the loop's idle wait; and counts the prefix cache's hits when the engine has one. The event loop's own share is
the wall time the decode thread was not busy. Measurement only: nothing here changes what the engine computes.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Self


class EngineProfile:
    def __init__(self, engine: Any) -> None:
        self.loop = engine._decode
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self._undo: list[tuple[Any, str, Any]] = []
        self._t0 = 0.0
        self.wall = 0.0

    def _wrap(self, obj: Any, name: str, phase: str, count=None) -> None:
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - t
                self.counts[phase] += 1
                if count is not None:
                    for key, n in count(*args, **kwargs).items():
                        self.counts[key] += n

        self._undo.append((obj, name, original))
        setattr(obj, name, timed)

    def __enter__(self) -> Self:
        loop = self.loop
        self._wrap(loop, "_prefill", "prefill", lambda batch, rows, out: {
            "prefill_rows": len(rows),
            "prompt_tokens": sum(len(r.req.prompt_ids) for r in rows)})
        self._wrap(loop, "_sample_into", "sample")
        self._wrap(loop, "_retire", "retire (keep)")
        self._wrap(loop, "_next_admissions", "idle / admission wait")
        self._wrap(loop, "_forget", "deliver")
        self._wrap(loop, "_iteration", "iteration")
        self._t0 = time.perf_counter()
        self._hits0 = dict(getattr(loop, "prefix_stats", {}) or {})
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self._t0
        for obj, name, _ in reversed(self._undo):
            delattr(obj, name)  # the wrappers are instance attributes over the class's methods
        stats = dict(getattr(self.loop, "prefix_stats", {}) or {})
        for k, v in stats.items():
            self.counts[f"prefix cache {k}"] = v - self._hits0.get(k, 0)

    def report(self, title: str) -> str:
        s, c = self.seconds, self.counts
        it = s["iteration"]
        decode = it - s["prefill"] - s["sample"] - s["retire (keep)"] - s["deliver"]
        lines = [f"{title}: {self.wall:.2f} s wall, decode thread busy {it:.2f} s over {c['iteration']} iterations"]
        rows = [
            ("prefill (forward + merge)", s["prefill"],
             f"{c['prefill']} passes, {c['prefill_rows']} sequences, {c['prompt_tokens']} prompt tokens"),
            ("decode steps (forward)", decode, ""),
            ("sampling", s["sample"], ""),
            ("retire (cache keep)", s["retire (keep)"], ""),
            ("deliver to the event loop", s["deliver"], ""),
            ("decode thread idle (waiting for work)", s["idle / admission wait"], ""),
        ]
        for name, sec, note in rows:
            lines.append(f"  {name:40s} {sec:7.2f} s  {100 * sec / self.wall:5.1f} %  {note}")
        extra = {k: v for k, v in c.items() if k.startswith("prefix cache")}
        if extra:
            lines.append("  " + ", ".join(f"{k} {v}" for k, v in sorted(extra.items())))
        return "\n".join(lines)

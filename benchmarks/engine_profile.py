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
        self.cpu: dict[str, float] = defaultdict(float)  # the decode thread's own CPU time (no waits for the GIL)
        self.counts: dict[str, int] = defaultdict(int)
        self._undo: list[tuple[Any, str, Any]] = []
        self._t0 = 0.0
        self.wall = 0.0

    def _wrap(self, obj: Any, name: str, phase: str, count=None) -> None:
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - t
                self.cpu[phase] += time.thread_time() - c
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
        self._hits0 = self._prefix_stats()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self._t0
        for obj, name, _ in reversed(self._undo):
            delattr(obj, name)  # the wrappers are instance attributes over the class's methods
        for k, v in self._prefix_stats().items():
            self.counts[f"prefix cache {k}"] = v - self._hits0.get(k, 0)

    def _prefix_stats(self) -> dict[str, int]:
        cache = getattr(self.loop, "prefix_cache", None)
        return dict(vars(cache.stats)) if cache is not None else {}

    def report(self, title: str) -> str:
        s, cpu, c = self.seconds, self.cpu, self.counts
        other = ("prefill", "sample", "retire (keep)", "deliver")
        s["decode"] = s["iteration"] - sum(s[k] for k in other)
        cpu["decode"] = cpu["iteration"] - sum(cpu[k] for k in other)
        head = (f"{title}: {self.wall:.2f} s wall; decode thread busy {s['iteration']:.2f} s "
                f"({cpu['iteration']:.2f} s of its own CPU) over {c['iteration']} iterations "
                f"({c['prefill']} with newcomers)")
        lines = [head]
        rows = [
            ("prefill (forward + merge)", "prefill",
             f"{c['prefill_rows']} sequences, {c['prompt_tokens']} prompt tokens"),
            ("decode steps (forward)", "decode", ""),
            ("sampling", "sample", ""),
            ("retire (cache keep)", "retire (keep)", ""),
            ("deliver to the event loop", "deliver", ""),
            ("idle (waiting for work)", "idle / admission wait", ""),
        ]
        lines.append(f"  {'':34s} {'wall s':>7s} {'% wall':>7s} {'CPU s':>7s}")
        for name, key, note in rows:
            lines.append(f"  {name:34s} {s[key]:7.2f} {100 * s[key] / self.wall:6.1f}% {cpu[key]:7.2f}  {note}")
        extra = {k: v for k, v in c.items() if k.startswith("prefix cache")}
        if extra:
            lines.append("  " + ", ".join(f"{k} {v}" for k, v in sorted(extra.items())))
        return "\n".join(lines)

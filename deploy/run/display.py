"""The run's one progress display: a live panel on a terminal (rich), plain timestamped lines elsewhere (a log
file, CI, a pipe). Both show step / total, ETA, reward, held-out accuracy, weight version, what each service is
doing, and the first error of any service."""

from __future__ import annotations

import sys
import time
from abc import ABC, abstractmethod
from typing import Any

from .progress import RunView


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "--"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "--" if value is None else format(value, fmt)


OFFLINE = ("sft", "rm", "dpo")
"""Algorithms whose runs are the learner alone (a loss to show, no reward)."""


def headline(v: RunView) -> str:
    warn = f"  health: {', '.join(sorted(v.health))}!" if v.health else ""
    if v.algorithm in OFFLINE:  # no reward, no rollout fleet: the loss is the figure to watch
        pairs = ""
        if v.pair_accuracy is not None:
            pairs = f"  pair acc {v.pair_accuracy:.1%}"
        if v.heldout_pairs is not None:
            pairs += f"  held-out pairs {v.heldout_pairs:.1%}"
        return (f"step {v.step}/{v.total or '?'}  ETA {_eta(v.eta_s)}  loss {_num(v.loss, '.4f')}{pairs}{warn}  "
                f"[{v.phase}]")
    acc = f"{v.evals[-1].accuracy:.1%} (step {v.evals[-1].step})" if v.evals else "--"
    if v.pair_accuracy is not None:  # online_dpo: the step's pairs
        warn = f"  pair acc {v.pair_accuracy:.1%}{warn}"
    return (f"step {v.step}/{v.total or '?'}  ETA {_eta(v.eta_s)}  reward {_num(v.reward)}  held-out {acc}  "
            f"weights v{v.weight_version if v.weight_version is not None else '-'}{_lengths(v.lengths)}"
            f"{_off_policy(v.off_policy)}{warn}  [{v.phase}]")


def _lengths(lengths: tuple[float, float] | None) -> str:
    """Mean completion length and the share that hit max_new_tokens (a policy babbling to the limit shows here)."""
    if lengths is None:
        return ""
    mean, at_max = lengths
    return f"  len {mean:.0f}" + (f" ({at_max:.0%} at max)" if at_max else "")


def _off_policy(o: dict[str, float]) -> str:
    """Staleness of the oldest token (mean/max), engine-vs-learner mismatch, tokens the correction rejected."""
    if not o:
        return ""
    out = f"  stale {o.get('staleness_mean', 0):.1f}/{o.get('staleness_max', 0):.0f}"
    if "mismatch_k3" in o:
        out += f"  mismatch {o['mismatch_k3']:.1e}"
    if o.get("is_rejected_frac"):
        out += f"  rejected {o['is_rejected_frac']:.0%}"
    return out


class Display(ABC):
    @abstractmethod
    def event(self, msg: str) -> None:
        """Something happened (a service started, an evaluation, an error)."""

    @abstractmethod
    def update(self, view: RunView) -> None:
        """The run as it is now."""

    def close(self) -> None:
        """The run is over."""


class LineDisplay(Display):
    """A line per event, and the headline at most every ``every_s`` seconds while steps move (every minute
    while they do not)."""

    def __init__(self, every_s: float = 10.0, stream=None) -> None:
        self.stream = stream or sys.stdout
        self.every_s = every_s
        self._last = (0.0, -1)
        self._waiting: str | None = None
        self._error: str | None = None
        self._sample: str | None = None

    def _print(self, msg: str) -> None:
        print(f"[fleetrl {time.strftime('%H:%M:%S')}] {msg}", file=self.stream, flush=True)

    def event(self, msg: str) -> None:
        self._print(msg)

    def update(self, view: RunView) -> None:
        now = time.monotonic()
        if view.error and view.error != self._error:
            self._error = view.error
            self._print(f"ERROR {view.error}")
        if view.waiting != self._waiting:
            self._waiting = view.waiting
            if view.waiting:
                self._print(f"learner waits: {view.waiting}")
        if view.sample != self._sample:
            self._sample = view.sample
            if view.sample:
                self._print(f"sample {view.sample}")
        t, step = self._last
        if (now - t >= self.every_s and view.step != step) or now - t >= 6 * self.every_s:
            self._last = (now, view.step)
            doing = "; ".join(f"{s.name}: {s.state}{', ' + s.doing if s.doing else ''}" for s in view.services)
            self._print(f"{headline(view)}  |  {doing}")


class LiveDisplay(Display):
    """A rich live panel, redrawn in place; events scroll above it."""

    def __init__(self, **console_options: Any) -> None:
        from rich.console import Console
        from rich.live import Live

        # no source location on each line: rich's log() ended every event with a link to display.py:131
        self.console = Console(log_path=False, **console_options)  # options: where to write (tests)
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def event(self, msg: str) -> None:
        # the text as it is: events quote what servers and models wrote, and rich markup in them ("[/get_reward]" in
        # a 404 page) raised MarkupError out of the launcher; "[bold]" was eaten as a style
        self.console.log(msg, markup=False, highlight=False)

    def update(self, view: RunView) -> None:
        from rich.console import Group
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        table = Table(box=None, expand=True, show_header=True, header_style="bold")
        table.add_column("service")
        table.add_column("state")
        table.add_column("doing", overflow="fold")
        for s in view.services:
            style = "green" if s.state == "ok" else "yellow" if s.state in ("starting", "exited 0") else "red"
            table.add_row(s.name, Text(s.state, style=style), s.doing)
        parts = [Text(headline(view), style="bold"),
                 ProgressBar(total=max(view.total, 1), completed=view.step)]
        if view.evals:
            curve = "  ".join(f"{e.step}:{e.accuracy:.0%}" for e in view.evals[-8:])
            parts.append(Text(f"held-out accuracy by step: {curve}"))
        parts.append(table)
        if view.waiting:
            parts.append(Text(f"learner waits: {view.waiting}", style="yellow"))
        if view.sample:
            parts.append(Text(f"sample {view.sample}", style="dim", overflow="ellipsis", no_wrap=True))
        if view.stalled:
            parts.append(Text(view.stalled, style="bold red"))
        if view.error:
            parts.append(Text(f"error: {view.error}", style="bold red"))
        self.live.update(Panel(Group(*parts), title=f"fleetrl run {view.run_name}"))

    def close(self) -> None:
        self.live.stop()


def make_display(live: bool | None = None) -> Display:
    """The live panel on a terminal, lines otherwise (``live`` forces one or the other)."""
    if live is None:
        live = sys.stdout.isatty()
    return LiveDisplay() if live else LineDisplay()

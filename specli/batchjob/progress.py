"""A batch job's progress bar on standard error (Rich): items done of all, the job's tokens/s
and its acceptance so far. Shown only when standard error is a terminal: a script that
captures it gets the one-line messages and nothing else."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class BatchProgress:
    """``with BatchProgress(total) as p: ... p.done(stats)`` after each item."""

    def __init__(self, total: int, console: Console | None = None, clock=time.perf_counter):
        self.console = console or Console(stderr=True)
        self.total = total
        self.clock = clock
        self.tokens = self.drafted = self.accepted = self.items = 0
        self.t0 = clock()
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[acceptance]}"),
                                 TimeElapsedColumn(), console=self.console, disable=not self.console.is_terminal)
        self.task = None

    @property
    def shown(self) -> bool:
        return self.console.is_terminal

    def __enter__(self) -> BatchProgress:
        self.t0 = self.clock()
        self.progress.start()
        self.task = self.progress.add_task("items", total=self.total, rate="", acceptance="")
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    @property
    def tokens_per_s(self) -> float:
        dt = self.clock() - self.t0
        return self.tokens / dt if dt > 0 else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def done(self, stats) -> None:
        """One more item finished, with its :class:`~specli.speculate.loop.Stats`."""
        self.items += 1
        self.tokens += stats.generated
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        acc = f"acceptance {100 * self.acceptance:.0f}%" if self.drafted else ""
        self.progress.update(self.task, completed=self.items, rate=f"{self.tokens_per_s:.1f} tok/s", acceptance=acc)

    def summary(self) -> str:
        """The job in one line (``--stats``)."""
        s = f"{self.items} items, {self.tokens} tokens, {self.tokens_per_s:.1f} tok/s"
        return s + (f", acceptance {100 * self.acceptance:.0f}%" if self.drafted else "")

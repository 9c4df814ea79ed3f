"""What ``specli bench`` shows while it runs and leaves behind: the progress bar, and the JSON
report file (for one target, and for files compared: :mod:`specli.cli.compare`)."""

from __future__ import annotations

import contextlib
import json
import os

from specli.errors import SpecliError


@contextlib.contextmanager
def suite_progress(as_json: bool):
    """A progress bar on stderr (none when JSON goes to a pipe); yields, for a suite's name, the
    callback ``run_bench`` reports its progress to."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=as_json and not console.is_terminal) as prog:
        task = prog.add_task("bench", total=1)

        def progress_for(name: str):
            def progress(desc: str, done: int, total: int) -> None:
                prog.update(task, description=f"{name} · {desc}", completed=done, total=total)
            return progress

        yield progress_for


def write_report(path: str, data: list[dict], n_suites: int) -> None:
    """The JSON report (one object, or a list for several suites), replaced whole: a signal
    arriving mid-write never leaves half a file."""
    tmp = f"{path}.partial"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data if n_suites > 1 else data[0], f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        raise SpecliError(f"cannot write the report to {path}: {e.strerror or e}") from None

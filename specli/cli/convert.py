"""specli convert-draft: a copy of a draft model in a quant type that runs fast on this CPU."""

from __future__ import annotations

import os

import typer

from specli.cli.common import app, err, one_line_errors


@app.command("convert-draft", epilog="""
Examples:

  specli convert-draft default          # the default profile's draft, priced against its target

  specli convert-draft ~/models/qwen2.5-0.5b-instruct-q4_k_m.gguf --target ~/models/qwen2.5-7b-q4_k_m.gguf
""")
@one_line_errors
def convert_draft(ref: str = typer.Argument(..., help="The draft model (a model reference), or a profile: its draft."),
                  type_name: str = typer.Option("Q4_0", "--type", help="The type every matrix of the copy gets."),
                  target: str | None = typer.Option(None, "--target", help="Price the draft in this target's tokens."),
                  threads: int | None = typer.Option(None, "--threads", help="Threads for the quantizer.")):
    """Requantise a draft model with llama.cpp's own quantizer (every matrix one type, Q4_0 by
    default) into specli's cache, named by its source's SHA-256: a draft never changes the
    target's text, so it may be any quant, and on many CPUs Q4_0 runs faster than the mixed
    types a file ships with. --draft auto uses the copy from then on (and says so). Prints the
    copy's path; the predicted cost of a draft token, as shipped and converted, on stderr."""
    from specli.errors import SpecliError
    from specli.hardware import calibrate, draft_offer
    from specli.resolve import converted, models, profiles
    from specli.resolve.gguf_header import read_gguf

    spec, tspec = profiles.ModelSpec((ref,)), profiles.ModelSpec((target,)) if target else None
    if ref.lower().endswith((".yaml", ".yml")):
        prof = profiles.get(ref)
    else:
        prof = None if os.path.exists(os.path.expanduser(ref)) else profiles.load_all().get(ref)
    if prof is not None:
        if not prof.draft_models:
            raise SpecliError(f"profile {prof.name} has no draft model to convert")
        spec, tspec = prof.draft_models[0], tspec or prof.target
    notes: list[str] = []
    path = models.resolve_spec(spec, progress=err, notes=notes)
    for n in notes:
        err(n)
    th = models.header_of_spec(tspec) if tspec else None
    cost = draft_offer.draft_cost(read_gguf(path), calibrate.kernel_table(), th, type_name)
    if cost is not None:
        err(cost.figures() + ("" if cost.pays else "; the copy is not predicted to pay here"))
    out, made = converted.convert(path, type_name, threads, err, spec.sha256)
    err(f"{'made' if made else 'already made'}: {out}; --draft auto uses it in place of {os.path.basename(path)}")
    print(out)

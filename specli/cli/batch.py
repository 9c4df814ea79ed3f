"""``specli run --batch FILE``: the command line's options as the job's defaults
(:mod:`specli.batchjob` runs it)."""

from __future__ import annotations

import typer

from specli.cli.common import err
from specli.errors import SpecliError
from specli.options import Options


def _check_flags(p: dict) -> None:
    if p["batch"] is None:
        raise SpecliError("--out, --strict and --parallel go with --batch FILE")
    for flag, given in (("--prompt", p["prompt"] is not None), ("--file", p["file"] is not None),
                        ("--json", p["as_json"])):
        if given:
            why = "each result line is JSON already" if flag == "--json" else "the prompts are the batch file's"
            raise SpecliError(f"--batch and {flag} exclude each other: {why}")


def run_batch(click_ctx: typer.Context, opts: Options) -> int:
    """The job ``specli run --batch`` asks for; its exit status (:mod:`specli.batchjob.job`)."""
    from specli.batchjob import BatchOptions, Defaults, run_job
    from specli.constrain import from_options
    from specli.session import Session
    from specli.speculate.verify import SamplingParams

    p = click_ctx.params
    _check_flags(p)
    constraint = from_options(p["json_schema"], p["regex"], p["grammar"])
    params = SamplingParams(temperature=p["temp"], top_k=p["top_k"], top_p=p["top_p"], seed=p["seed"])
    defaults = Defaults(p["max_tokens"], params, constraint, p["chat"], p["system"])
    job = BatchOptions(p["batch"], p["out"], p["strict"], p["parallel"], p["stats"], defaults)

    def open_session() -> Session:
        sess = Session(opts, progress=err)
        for note in opts.notes:
            err(note)
        return sess

    return run_job(job, open_session, err)

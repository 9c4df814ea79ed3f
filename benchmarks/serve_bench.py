#!/usr/bin/env python3
"""`specli serve` against the library it wraps, side by side in one run, on one Session.

1. Each prompt through the library (``Session.generate``) and through the server (the
   official openai client, streamed), interleaved lib, server, server, lib so both see the
   same machine and the same adaptive state; the caches are cleared before every run, so
   each one pays its prefill. Tokens/s end to end (request to last token) and time to first
   token; the greedy texts must be identical.
2. Eight clients at once (threads, non-streamed): all answered, each with its own prompt's
   greedy text, nothing lost.

Writes a Markdown report (default benchmarks/results/serve-benchmark.md).

    python benchmarks/serve_bench.py --profile default --max-tokens 64
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time

import openai

from specli.serve.app import create_app
from specli.serve.runner import background
from specli.session import Options, Session
from specli.speculate.settings import SpecSettings
from specli.speculate.verify import SamplingParams

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in two sentences what a hash table is.",
    "Rewrite this sentence in the passive voice: The cat chased the mouse across the kitchen.",
]
GREEDY = SamplingParams(temperature=0.0)


def clear_caches(sess: Session) -> None:
    sess.ctx.clear()
    dm = getattr(sess.drafter, "model", None)
    if dm is not None and hasattr(dm, "ctx"):
        dm.ctx.clear()


def lib_run(sess: Session, prompt: str, n: int) -> dict:
    clear_caches(sess)
    t0 = time.perf_counter()
    toks = sess.prompt_tokens(prompt, chat=True)
    resp = sess.generate(toks, GREEDY, n)
    first, pieces = None, []
    for ch in resp:
        if first is None and ch.text:
            first = time.perf_counter()
        pieces.append(ch.text)
    t1 = time.perf_counter()
    return {"text": "".join(pieces), "tokens": resp.stats.generated, "wall": t1 - t0, "ttft": (first or t1) - t0,
            "loop": resp.stats.tokens_per_s}


def server_run(sess: Session, client: openai.OpenAI, model: str, prompt: str, n: int) -> dict:
    clear_caches(sess)  # the worker is idle between requests
    t0 = time.perf_counter()
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                            temperature=0, max_tokens=n, stream=True,
                                            stream_options={"include_usage": True})
    first, pieces, tokens, loop = None, [], 0, 0.0
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            first = first or time.perf_counter()
            pieces.append(ch.choices[0].delta.content)
        if ch.usage:
            tokens, loop = ch.usage.completion_tokens, ch.usage.model_extra["speculative"]["tokens_per_s"]
    t1 = time.perf_counter()
    return {"text": "".join(pieces), "tokens": tokens, "wall": t1 - t0, "ttft": (first or t1) - t0, "loop": loop}


def concurrent(client: openai.OpenAI, model: str, prompts: list[str], n: int) -> dict:
    answers: dict[int, str] = {}
    latency: dict[int, float] = {}
    cached: dict[int, tuple[int, int]] = {}
    errors: list[str] = []

    def ask(i: int, p: str) -> None:
        t = time.perf_counter()
        try:
            r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": p}],
                                               temperature=0, max_tokens=n)
            answers[i] = r.choices[0].message.content
            cached[i] = (r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens)
        except openai.APIError as e:
            errors.append(f"client {i}: {e}")
        latency[i] = time.perf_counter() - t

    t0 = time.perf_counter()
    threads = [threading.Thread(target=ask, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"answers": answers, "latency": latency, "cached": cached, "errors": errors,
            "wall": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile")
    ap.add_argument("--target")
    ap.add_argument("--draft", default="auto")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="lib, server, server, lib rounds per prompt")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "serve-benchmark.md"))
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    # no lookup history on either side: each repeat of a prompt would copy the earlier one's answer
    sess = Session(Options(target=a.target, draft=a.draft, profile=a.profile, spec=SpecSettings(lookup_history="0")))
    for note in sess.opts.notes:
        print(note, file=sys.stderr)
    rows = []
    with background(create_app(sess, queue=max(8, a.clients))) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=1200)
        model = client.models.list().data[0].id
        # warm-up, unmeasured: first-touch costs (weights paged in, buffers sized) belong to neither side
        lib_run(sess, PROMPTS[0], a.max_tokens)
        server_run(sess, client, model, PROMPTS[0], a.max_tokens)
        for p in PROMPTS:
            lib, srv = [], []
            for _ in range(a.rounds):  # lib, server, server, lib: both sides see the same drift
                lib.append(lib_run(sess, p, a.max_tokens))
                srv += [server_run(sess, client, model, p, a.max_tokens) for _ in range(2)]
                lib.append(lib_run(sess, p, a.max_tokens))
            rows.append({"prompt": p, "lib": lib, "srv": srv,
                         "identical": len({r["text"] for r in lib + srv}) == 1})
            print(f"{p[:40]!r}: lib {best(lib):.2f} tok/s, server {best(srv):.2f} tok/s (best runs)", file=sys.stderr)
        refs = {p: r["lib"][0]["text"] for p, r in zip(PROMPTS, rows)}
        asked = [PROMPTS[i % len(PROMPTS)] for i in range(a.clients)]
        conc = concurrent(client, model, asked, a.max_tokens)
    conc["correct"] = sum(conc["answers"].get(i) == refs[p] for i, p in enumerate(asked))
    conc["diffs"] = [f"client {i} ({p[:30]!r}...; {conc['cached'][i][0]} of its {conc['cached'][i][1]} prompt "
                     f"tokens were in the cache): differs from character "
                     f"{first_diff(conc['answers'][i], refs[p])}: {conc['answers'][i]!r} vs {refs[p]!r}"
                     for i, p in enumerate(asked) if i in conc["answers"] and conc["answers"][i] != refs[p]]
    conc["load"] = (load0, os.getloadavg()[0])
    report = markdown(sess, a, rows, conc)
    sess.close()
    with open(a.out, "w") as f:
        f.write(report)
    print(report)


def first_diff(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def rates(runs: list[dict]) -> list[float]:
    """Tokens/s of each run, end to end."""
    return [r["tokens"] / r["wall"] for r in runs]


def best(runs: list[dict]) -> float:
    """The fastest run: on a shared machine, the one least disturbed by other jobs."""
    return max(rates(runs))


def markdown(sess: Session, a, rows: list[dict], conc: dict) -> str:
    ratios = [best(row["srv"]) / best(row["lib"]) for row in rows]
    med_ratios = [statistics.median(rates(row["srv"])) / statistics.median(rates(row["lib"])) for row in rows]
    ratio = statistics.geometric_mean(ratios)
    med_ratio = statistics.geometric_mean(med_ratios)
    out = [
        "# specli serve vs the library",
        "",
        f"Generated by `python benchmarks/serve_bench.py{' --profile ' + a.profile if a.profile else ''}"
        f"{' --target ' + a.target if a.target else ''}{' --draft ' + a.draft if a.target else ''}"
        f" --max-tokens {a.max_tokens} --rounds {a.rounds}` on {platform.machine()}, {os.cpu_count()} CPU cores "
        f"({platform.system()}).",
        "",
        f"Target `{os.path.basename(sess.target.path)}`, drafter `{sess.drafter.name}`"
        + (f" (`{os.path.basename(sess.draft_model.path)}`)" if sess.draft_model else "")
        + f", context {sess.ctx.n_ctx}, greedy, {a.max_tokens} tokens a request.",
        "",
        f"Each prompt ran {a.rounds} rounds of library, server, server, library, after one unmeasured run "
        "of each; the caches were cleared before every run, so each pays its prefill. Tokens/s is end to "
        "end, request to last token; the library is `Session.generate` in this process, the server the "
        "official openai client, streamed, over loopback HTTP to the same Session. Best = the fastest "
        "run of each side (the one least disturbed by other jobs), median beside it.",
        "",
        "| prompt | library tok/s best (median) | server tok/s best (median) | ratio best (median) "
        "| library TTFT s | server TTFT s | loop tok/s library / server | same text |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row, r, mr in zip(rows, ratios, med_ratios):
        lt = min(x["ttft"] for x in row["lib"])
        st = min(x["ttft"] for x in row["srv"])
        out.append(f"| {row['prompt'][:48]} | {best(row['lib']):.2f} ({statistics.median(rates(row['lib'])):.2f}) "
                   f"| {best(row['srv']):.2f} ({statistics.median(rates(row['srv'])):.2f}) | {r:.3f} ({mr:.3f}) "
                   f"| {lt:.3f} | {st:.3f} | {max(x['loop'] for x in row['lib']):.2f} / "
                   f"{max(x['loop'] for x in row['srv']):.2f} | {'yes' if row['identical'] else 'NO'} |")
    out += [
        "",
        f"Server / library throughput (geometric mean over the prompts): **{ratio:.3f}x** from the best runs, "
        f"{med_ratio:.3f}x from the medians (target >= 0.95x). TTFT: the fastest run of each side, "
        "request to first text. Loop tok/s: the decoding loop's own rate (first to last token, `Stats`), "
        "best run of each side: where it differs as much as the end-to-end rate, the difference is the "
        "machine, not the HTTP path.",
        "",
        f"## {a.clients} concurrent clients",
        "",
        f"{a.clients} threads sent their request at once (non-streamed, {a.max_tokens} tokens each); the server "
        "generates one at a time, in arrival order.",
        "",
        f"- answered: {len(conc['answers'])} of {a.clients}; errors: {len(conc['errors'])}"
        + (f" ({'; '.join(conc['errors'])})" if conc["errors"] else ""),
        f"- each answer the greedy text of its own prompt (as generated from an empty cache): "
        f"{conc['correct']} of {a.clients}",
        *[f"  - {d}" for d in conc["diffs"]],
        f"- wall time {conc['wall']:.1f}s; latency per client {min(conc['latency'].values()):.1f}s (first served) "
        f"to {max(conc['latency'].values()):.1f}s (last)",
        "",
        f"The machine is shared and noisy: other jobs ran beside the benchmark (load average "
        f"{conc['load'][0]:.1f} at the start, {conc['load'][1]:.1f} at the end, on {os.cpu_count()} cores). The "
        "ratio comes from runs interleaved in the same process, which cancels most of the drift but not all "
        "of it: single runs of the same prompt on the same side differ by more than the ratio's distance from 1.",
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    main()

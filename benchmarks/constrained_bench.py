"""Constrained decoding, plain vs speculative, side by side in one run; and llama-server.

Every prompt of benchmarks/structured_suite.yaml (extraction and tool arguments, each with its
JSON schema) is answered under its schema by each mode, the modes interleaved (each round
runs every prompt once in every mode, in a rotating order), so a busy neighbour slows them
alike:

- ``plain``: constrained greedy decoding, no drafting (the baseline; like every mode, it asks
  for no logits where the grammar allows one token only);
- ``forced``: the tokens the grammar forces drafted for free, nothing else;
- ``lookup+forced``: forced tokens and prompt lookup, no draft model;
- ``hybrid+forced``: specli's default drafters (prompt lookup + the draft model) with forced
  tokens (what ``specli run --json-schema`` does);
- any other draft mode by name, with or without ``+forced`` (``--modes``; ``hybrid``: the
  default drafters without forced tokens);
- ``llama-server`` / ``llama-server+draft`` (``--llama-server``): llama.cpp's server, built
  from the same llama.cpp (tests/llama_server.py), with the same schema in its ``json_schema``
  field, plain and with the draft model (``-md``).

specli's modes must print plain's tokens exactly (or part at a near-tie, by
specli.measure.lossless); llama-server's answers are compared as parsed JSON (its grammar
allows other whitespace). Rates exclude prompt processing.

    python benchmarks/constrained_bench.py --profile default --repeat 1 --llama-server \\
        --out benchmarks/results/constrained_bench.json --md benchmarks/results/constrained_bench.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

from specli.constrain import Constraint
from specli.engine import extra_buffer_types
from specli.measure.lossless import divergence
from specli.session import Options, Session
from specli.speculate.drafters import NoDrafter
from specli.speculate.forced import ForcedDrafter
from specli.speculate.settings import SpecSettings
from specli.speculate.verify import SamplingParams

HERE = Path(__file__).resolve().parent
MODES = ("plain", "forced", "lookup+forced", "hybrid+forced")


def load_suite(path: Path) -> list[dict]:
    data = yaml.safe_load(path.read_text())
    for p in data["prompts"]:
        Constraint.json_schema(p["schema"]).check()
    return data["prompts"]


def drafter(sess: Session, mode: str):
    """``plain``, ``forced``, or a draft mode's name (``hybrid``, ``lookup``, ...) with or
    without ``+forced``."""
    if mode == "plain":
        return NoDrafter()
    if mode == "forced":
        return ForcedDrafter(NoDrafter())
    inner = sess.drafter_for(mode.removesuffix("+forced"))
    return ForcedDrafter(inner) if mode.endswith("+forced") else inner


def run_specli(sess: Session, mode: str, toks: list[int], schema: dict, n: int) -> dict:
    sess.ctx.clear()
    asked = sess.ctx.rows_with_logits
    # history=None: no mode copies from the answers the runs before it gave the same prompt
    resp = sess.generate(toks, SamplingParams(), n, drafter(sess, mode), constraint=Constraint.json_schema(schema),
                         history=None)
    out = [t for ch in resp for t in ch.tokens]
    st = resp.stats
    return {"tokens": out, "n": st.generated, "s": st.t_generate, "drafted": st.drafted, "accepted": st.accepted,
            "steps": st.steps, "by_source": st.accepted_by_source, "drafted_by_source": st.drafted_by_source,
            "stop": st.stop, "rows": 1 + st.steps + st.drafted, "logit_rows": sess.ctx.rows_with_logits - asked}


class LlamaServers:
    """llama-server plain and with the draft model, started once, idle between requests."""

    def __init__(self, sess: Session, threads: int, log_dir: Path):
        sys.path.insert(0, str(HERE.parent / "tests"))
        import llama_server as ls

        self.ls = ls
        binary = str(ls.build())
        self.stack = []
        self.urls = {}
        base = [binary, "-m", sess.target.path, "-t", str(threads), "-tb", str(threads), "-c", "4096",
                "-np", "1", "--no-warmup"] + ([] if extra_buffer_types() else ["--no-repack"])
        cfgs = {"llama-server": []}
        if sess.draft_path:
            cfgs["llama-server+draft"] = ["-md", sess.draft_path, "-td", str(threads), "-tbd", str(threads)]
        for name, extra in cfgs.items():
            port = str(ls.free_port())
            cm = ls.running(base + extra + ["--port", port], log_dir / f"{name}.log")
            self.urls[name] = cm.__enter__()
            self.stack.append(cm)

    def run(self, name: str, toks: list[int], schema: dict, n: int) -> dict:
        body = {"prompt": toks, "n_predict": n, "temperature": 0.0, "top_k": 1, "json_schema": schema,
                "cache_prompt": False}
        r = self.ls.post_json(self.urls[name] + "/completion", body)
        t = r.get("timings", {})
        return {"text": r.get("content", ""), "n": int(t.get("predicted_n", 0)),
                "s": float(t.get("predicted_ms", 0.0)) / 1000.0, "drafted": int(t.get("draft_n", 0) or 0),
                "accepted": int(t.get("draft_n_accepted", 0) or 0)}

    def close(self):
        for cm in reversed(self.stack):
            cm.__exit__(None, None, None)


def _args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="default")
    ap.add_argument("--target", default=None, help="a target instead of the profile's")
    ap.add_argument("--draft", default="auto")
    ap.add_argument("--prompts", default=None, help="only these prompt ids (comma-separated)")
    ap.add_argument("--suite", default=str(HERE / "structured_suite.yaml"))
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--llama-server", action="store_true", help="also time llama-server with the same schema")
    ap.add_argument("--out", default=None, help="JSON results")
    ap.add_argument("--md", default=None, help="markdown report")
    return ap.parse_args()


def _measure(one, all_modes: list[str], prompts: list[dict], repeat: int, max_tokens: int) -> dict:
    """Every mode on every prompt, ``repeat`` rounds, the modes' order rotated per prompt and round."""
    for m in all_modes:  # warm-up
        one(m, prompts[0], 16)
    results = {m: {} for m in all_modes}
    for r in range(repeat):
        for i, p in enumerate(prompts):
            order = all_modes[(i + r) % len(all_modes):] + all_modes[:(i + r) % len(all_modes)]
            for m in order:
                res = one(m, p, max_tokens)
                results[m].setdefault(p["id"], []).append(res)
                print(f"round {r} {p['id']:<14} {m:<18} {res['n']:4d} tok {res['n'] / res['s']:6.2f} tok/s",
                      file=sys.stderr, flush=True)
    return results


def _json_check(text: str, ref_obj) -> str:
    try:
        return "same JSON value" if json.loads(text) == ref_obj else "another JSON value"
    except json.JSONDecodeError:
        return "invalid JSON"


def _checks(sess, toks: dict, results: dict, prompts: list[dict]) -> dict:
    """Each mode's text against plain constrained decoding's: token for token for specli's
    modes, as a JSON value for llama-server's."""
    checks = {m: {} for m in results}
    for p in prompts:
        pid = p["id"]
        plain = results["plain"][pid][0]
        try:
            ref_obj = json.loads(sess.target.detokenize(plain["tokens"]))
        except json.JSONDecodeError:  # cut short by --max-tokens
            ref_obj = None
        for m, by_prompt in results.items():
            runs = by_prompt[pid]
            if m.startswith("llama-server"):
                checks[m][pid] = _json_check(runs[0]["text"], ref_obj)
                continue
            verdicts = []
            for run in runs:
                d = divergence(sess.ctx, toks[pid], plain["tokens"], run["tokens"])
                verdicts.append("identical" if d is None and len(run["tokens"]) == len(plain["tokens"])
                                else d.describe() if d else "a prefix")
            checks[m][pid] = "identical" if all(v == "identical" for v in verdicts) else \
                "; ".join(dict.fromkeys(verdicts))  # each round's verdict once (rounds often part alike)
    return checks


def _summary(results: dict) -> tuple[dict, dict]:
    """Each mode's totals and speed over plain's, overall and per prompt."""
    summary = {}
    for m, by_prompt in results.items():
        runs = [x for rs in by_prompt.values() for x in rs]
        n, s = sum(x["n"] for x in runs), sum(x["s"] for x in runs)
        summary[m] = {"tokens": n, "seconds": s, "tokens_per_s": n / s if s else 0.0,
                      "drafted": sum(x.get("drafted", 0) for x in runs),
                      "accepted": sum(x.get("accepted", 0) for x in runs),
                      "rows": sum(x.get("rows", 0) for x in runs),
                      "logit_rows": sum(x.get("logit_rows", 0) for x in runs)}
    base = summary["plain"]["tokens_per_s"]
    for m in results:
        summary[m]["vs_plain"] = summary[m]["tokens_per_s"] / base if base else 0.0
    per_prompt = {m: {pid: sum(x["n"] for x in runs) / sum(x["s"] for x in runs) / (
        sum(x["n"] for x in results["plain"][pid]) / sum(x["s"] for x in results["plain"][pid]))
        for pid, runs in results[m].items()} for m in results}
    return summary, per_prompt


def main() -> int:
    a = _args()
    prompts = load_suite(Path(a.suite))
    if a.prompts:
        prompts = [p for p in prompts if p["id"] in a.prompts.split(",")]
    threads = a.threads or os.cpu_count() or 1
    opts = Options(target=a.target, draft=a.draft, profile=None if a.target else a.profile, threads=threads,
                   spec=SpecSettings())
    sess = Session(opts, build_drafter=False)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    toks = {p["id"]: sess.prompt_tokens(p["text"]) for p in prompts}
    servers = LlamaServers(sess, threads, Path(a.out or "constrained_bench.json").parent) if a.llama_server else None
    all_modes = modes + (list(servers.urls) if servers else [])

    def one(mode, p, n):
        if mode.startswith("llama-server"):
            return servers.run(mode, toks[p["id"]], p["schema"], n)
        return run_specli(sess, mode, toks[p["id"]], p["schema"], n)

    results = _measure(one, all_modes, prompts, a.repeat, a.max_tokens)
    if servers:
        servers.close()
    checks = _checks(sess, toks, results, prompts)
    summary, per_prompt = _summary(results)
    report = {"command": "python " + " ".join(sys.argv),
              "target": sess.target.path, "draft": sess.draft_path, "threads": threads, "repeat": a.repeat,
              "max_tokens": a.max_tokens, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "summary": summary, "per_prompt_vs_plain": per_prompt, "checks": checks,
              "outputs": {pid: sess.target.detokenize(results["plain"][pid][0]["tokens"]) for pid in toks},
              "runs": {m: {pid: [{k: v for k, v in x.items() if k != "tokens"} for x in runs]
                           for pid, runs in results[m].items()} for m in all_modes}}
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1, ensure_ascii=False))
    md = render(report, prompts)
    if a.md:
        Path(a.md).write_text(md)
    print(md)
    sess.close()
    return 0


def render(rep: dict, prompts: list[dict]) -> str:
    modes = list(rep["summary"])
    lines = [f"Constrained decoding benchmark, {rep['when']}: {os.path.basename(rep['target'])}"
             + (f" with draft {os.path.basename(rep['draft'])}" if rep["draft"] else "")
             + f", {rep['threads']} threads, {len(prompts)} prompts x {rep['repeat']} rounds, greedy, "
             f"up to {rep['max_tokens']} tokens, modes interleaved.", "", f"    {rep['command']}", "",
             "| mode | tokens | tok/s | vs plain | drafted | accepted | rows with logits / verified |",
             "|---|---|---|---|---|---|---|"]
    for m in modes:
        s = rep["summary"][m]
        lines.append(f"| {m} | {s['tokens']} | {s['tokens_per_s']:.2f} | {s['vs_plain']:.2f}x | {s['drafted']} "
                     f"| {s['accepted']} | {s['logit_rows']} / {s['rows']} |")
    lines += ["", "Per prompt, tokens/s over plain's (and the text check):", "",
              "| prompt | " + " | ".join(modes[1:]) + " |", "|---" * len(modes) + "|"]
    for p in prompts:
        pid = p["id"]
        cells = [f"{rep['per_prompt_vs_plain'][m][pid]:.2f}x ({rep['checks'][m][pid]})" for m in modes[1:]]
        lines.append(f"| {pid} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

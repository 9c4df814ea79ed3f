"""How often a draft model's tokens are kept at temperature > 0, under the verify rule of the
checkout it runs in: a fixed draft length (so the controller's timings play no part), the same
prompts, seeds and token budget for every rule.

    python -m research.studies.seeded_acceptance --profile default --temps 0.3,0.8 --seeds 6
    PYTHONPATH=/path/to/older/checkout python -m research.studies.seeded_acceptance ...  # another rule
    python -m research.studies.seeded_acceptance ... --greedy-draft  # this rule, drafts not noise-coupled

``--greedy-draft`` drafts the draft model's argmax (as specli did before drafts shared the
target's noise) under this checkout's rule. Prints one JSON record per temperature: drafted,
accepted, acceptance, mean accepted tokens per speculative step.
"""

from __future__ import annotations

import argparse
import json

from specli.session import Options, Session
from specli.speculate.settings import SpecSettings
from specli.speculate.verify import SamplingParams

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain in two sentences what a hash map is.",
           "def fibonacci(n):"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile")
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--temps", default="0.3,0.8")
    ap.add_argument("--seeds", type=int, default=6, help="seeds 1..N per prompt")
    ap.add_argument("--prompts", type=int, default=1, help="how many of the built-in prompts")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--greedy-draft", action="store_true")
    a = ap.parse_args()
    if a.greedy_draft:
        from specli.speculate import drafters
        drafters.draft_top = lambda sampler, pos: drafters.row_top
    opts = Options(target=a.target, draft=a.draft or "auto", profile=a.profile, threads=a.threads, lookup=False,
                   spec=SpecSettings(adaptive=False, draft_max=a.draft_max))
    sess = Session(opts)
    for t in (float(x) for x in a.temps.split(",")):
        drafted = accepted = steps = 0
        for text in PROMPTS[:a.prompts]:
            prompt = sess.prompt_tokens(text)
            for seed in range(1, a.seeds + 1):
                resp = sess.generate(prompt, SamplingParams(temperature=t, seed=seed), a.tokens)
                for _ in resp:
                    pass
                st = resp.stats
                drafted, accepted, steps = drafted + st.drafted, accepted + st.accepted, steps + st.spec_steps
        print(json.dumps({"temperature": t, "mode": sess.drafter.name, "greedy_draft": a.greedy_draft,
                          "drafted": drafted, "accepted": accepted,
                          "acceptance": round(accepted / drafted, 4) if drafted else None,
                          "mean_accepted": round(accepted / steps, 3) if steps else None}), flush=True)
    sess.close()


if __name__ == "__main__":
    main()

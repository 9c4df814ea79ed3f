"""The combination matrix's axes and models (tests/test_matrix.py, tests/test_matrix_cli.py):
every drafter, as `--draft` and `--adaptive/--fixed` name it, with the tiny f32 models it
drafts for, the constraints and the sampling settings. Shared by the in-process matrix and the
entry points' (CLI, server) so both cover the same cells."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from conftest import TEST_CACHE
from tiny2026 import tiny_2026_model
from tinyheads import tiny_head_model
from tinymodels import tiny_model

# the family of tiny models each drafter drafts for: (target, draft reference) builders
FAMILIES = ("pair", "mtp", "eagle3", "dflash", "early-exit", "layer-skip")
# a draft derived from the target's own layers (issue 39): as --draft names it, for a 4-layer target
OWN_DRAFTS = {"early-exit": "early-exit:2", "layer-skip": "layer-skip:1-2"}

# drafter (as the issue names it) -> (family, how --draft names it: "draft" the family's draft file,
# "--no-lookup" without lookup, the mode run reports under --adaptive and under --fixed)
@dataclass(frozen=True)
class Drafter:
    name: str
    family: str
    draft: str  # "none", "lookup", "mtp", or "file" (the family's draft model or head)
    lookup: bool  # --lookup / --no-lookup (with a draft model, MTP or a head)
    adaptive_mode: str
    fixed_mode: str

    def mode(self, adaptive: bool) -> str:
        return self.adaptive_mode if adaptive else self.fixed_mode


DRAFTERS = [
    Drafter("none", "pair", "none", True, "none", "none"),
    Drafter("lookup", "dflash", "lookup", True, "lookup", "lookup-fixed"),  # its target copies
    Drafter("model", "pair", "file", False, "model", "model-fixed"),
    Drafter("hybrid", "pair", "file", True, "hybrid", "model-fixed"),
    Drafter("mtp", "mtp", "mtp", False, "mtp", "mtp-fixed"),
    Drafter("mtp-lookup", "mtp", "mtp", True, "mtp-lookup", "mtp-fixed"),
    Drafter("eagle3", "eagle3", "file", False, "eagle3", "eagle3-fixed"),
    Drafter("eagle3-lookup", "eagle3", "file", True, "eagle3-lookup", "eagle3-fixed"),
    Drafter("dflash", "dflash", "file", False, "dflash", "dflash-fixed"),
    Drafter("dflash-lookup", "dflash", "file", True, "dflash-lookup", "dflash-fixed"),
    Drafter("early-exit", "early-exit", "file", False, "early-exit:2", "early-exit:2-fixed"),
    Drafter("layer-skip-lookup", "layer-skip", "file", True, "layer-skip:1-2+lookup", "layer-skip:1-2-fixed"),
]
# the drafters from the target's own layers: each with every constraint and sampling in turn,
# not in every combination (a draft model drafts in the cells of "model" and "hybrid" already)
OWN = {"early-exit", "layer-skip-lookup"}
BY_NAME = {d.name: d for d in DRAFTERS}
POLICIES = {"adaptive": True, "fixed": False}

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer"}}, "required": ["name", "n"]}
REGEX = r"[a-z]+( [a-z]+)+"
GBNF = 'root ::= "The answer is " ("yes" | "no") ", because " [a-z ]+ "."\n'
CONSTRAINTS = ("none", "json-schema", "regex", "grammar")
SAMPLINGS = {"greedy": (0.0, None), "seeded": (0.8, 7)}

PROMPT = "1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2,"  # repeats: prompt lookup finds copies
N = 24


def family_models(smol_gguf: str, family: str) -> tuple[str, str | None]:
    """(target path, draft file: the draft model or head; None for MTP layers in the target; a
    draft from the target's own layers as --draft names it)."""
    if family in OWN_DRAFTS:
        return str(tiny_model(TEST_CACHE, smol_gguf, seed=0, attn_scale=0.3, n_layer=4)), OWN_DRAFTS[family]
    if family == "pair":
        return (str(tiny_model(TEST_CACHE, smol_gguf, seed=0, attn_scale=0.3)),
                str(tiny_model(TEST_CACHE, smol_gguf, seed=0, attn_scale=0.3, noise=0.05)))
    if family == "mtp":
        return str(tiny_2026_model(TEST_CACHE, smol_gguf, "qwen35-mtp-full")), None
    if family == "eagle3":
        return (str(tiny_head_model(TEST_CACHE, smol_gguf, "bigram")),
                str(tiny_head_model(TEST_CACHE, smol_gguf, "eagle3-full")))
    return (str(tiny_head_model(TEST_CACHE, smol_gguf, "copy")),
            str(tiny_head_model(TEST_CACHE, smol_gguf, "dflash-full")))


def draft_arg(d: Drafter, draft_file: str | None) -> str:
    return draft_file if d.draft == "file" else d.draft


def cli_flags(d: Drafter, adaptive: bool, constraint: str, sampling: str, files: dict) -> list[str]:
    """The flags `run` / `bench` take for this cell (``files``: the constraint files by kind)."""
    flags = ["--adaptive" if adaptive else "--fixed", "--lookup" if d.lookup else "--no-lookup"]
    if constraint == "json-schema":
        flags += ["--json-schema", files["json-schema"]]
    elif constraint == "regex":
        flags += ["--regex", REGEX]
    elif constraint == "grammar":
        flags += ["--grammar", files["grammar"]]
    temp, seed = SAMPLINGS[sampling]
    if seed is not None:
        flags += ["--temp", str(temp), "--seed", str(seed)]
    return flags


def constraint_files(folder) -> dict:
    (folder / "schema.json").write_text(json.dumps(SCHEMA))
    (folder / "answer.gbnf").write_text(GBNF)
    return {"json-schema": str(folder / "schema.json"), "grammar": str(folder / "answer.gbnf")}


def pairwise(cells: list, axes: list[tuple]) -> list[tuple]:
    """Each of ``cells`` (tuples) with one value of every further axis, in turn, so that across
    the cells every value of each axis, and every pair of two axes' values, comes up (the axes
    are small: 4 x 2)."""
    out = []
    for i, cell in enumerate(cells):
        picks, j = [], i
        for values in axes:
            picks.append(values[j % len(values)])
            j = j // len(values) + j  # shift, so the next axis pairs with every value of this one
        out.append((*cell, *picks))
    return out


def env_with_cache(cache) -> dict:
    return {**os.environ, "SPECLI_CACHE": str(cache)}

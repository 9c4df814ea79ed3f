"""Profiles: curated target/draft pairs with the draft settings that suit them (YAML, read with
``safe_load`` only). Shipped ones live in the package; users add their own in the platform
config directory (``~/.config/specli/profiles`` on Linux, or ``$SPECLI_CONFIG_DIR/profiles``).

A model entry is a reference string, or a mapping ``{sources: [ref, ...], sha256: HEX}``
whose sources are tried in order (the Hub first, a PyPI wheel second, say). A drafts entry may
also be the word ``mtp`` (the target's own multi-token-prediction layers: no file) or ``lookup``
(prompt lookup); ``ModelSpec.kind`` tells them apart, ``Profile.draft_models`` lists the files.
``get`` also takes a path to a profile file (``--profile ./my-pair.yaml``).
"""

from __future__ import annotations

import copy
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from specli.errors import SpecliError
from specli.utf8 import decode_utf8

TOP_KEYS = {"name", "description", "target", "cpu_target", "drafts", "defaults", "hf_target", "hf_draft"}
# hf_target / hf_draft: the same pair as Hugging Face safetensors repos (org/repo), for engines that
# cannot load GGUF drafts (vLLM, SGLang; see specli export)
MODEL_KEYS = {"sources", "sha256", "size"}
# a profile's defaults, named as the CLI options they fill (specli.resolve.choose.apply_profile_defaults)
DEFAULT_KEYS = ("ctx", "draft_max", "draft_p_min")
# drafts entries that name a drafter instead of a model: the target's own multi-token-prediction
# layers (no file), and prompt lookup (no model); kept as ModelSpec(("mtp",)) / ModelSpec(("lookup",))
DRAFTERS = ("mtp", "lookup")
# drafts entries naming a draft derived from the target: early-exit[:E], layer-skip[:SET]
SELF_DRAFTERS = ("early-exit", "layer-skip")
SHIPPED = "specli/profiles/"  # the `path` of a shipped profile starts with this


@dataclass(frozen=True)
class ModelSpec:
    sources: tuple[str, ...]
    sha256: str | None = None
    size: int | None = None

    @property
    def ref(self) -> str:
        return self.sources[0]

    @property
    def kind(self) -> str:
        """'mtp' or 'lookup' for a drafts entry naming a drafter rather than a file, else 'model'."""
        if len(self.sources) == 1 and self.ref.split(":")[0] in SELF_DRAFTERS:
            return "self"  # a draft derived from the target's own layers (resolve.derive)
        return self.ref if self.ref in DRAFTERS and len(self.sources) == 1 else "model"


@dataclass
class Profile:
    name: str
    target: ModelSpec
    drafts: list[ModelSpec] = field(default_factory=list)
    defaults: dict = field(default_factory=dict)
    description: str = ""
    path: str = ""
    hf_target: str | None = None  # safetensors repo of the target (specli export --to vllm|sglang)
    hf_draft: str | None = None  # ... and of the first draft
    # the same model in a file that verifies cheaply on CPUs (llama.cpp repacks Q4_0 for its
    # batched kernels), where the publisher has one: named on a CPU, never switched to
    cpu_target: ModelSpec | None = None

    @property
    def wants_mtp(self) -> bool:
        """The profile asks for self-speculation through the target's own MTP layers."""
        return any(d.kind == "mtp" for d in self.drafts)

    @property
    def own_draft(self) -> str | None:
        """The draft derived from the target the profile asks for (``early-exit:4``), if any."""
        return next((d.ref for d in self.drafts if d.kind == "self"), None)

    @property
    def draft_models(self) -> list[ModelSpec]:
        """The drafts entries that are model files (to resolve, download, check), in order."""
        return [d for d in self.drafts if d.kind == "model"]


def config_dir() -> Path:
    if os.environ.get("SPECLI_CONFIG_DIR"):
        return Path(os.environ["SPECLI_CONFIG_DIR"])
    import typer
    return Path(typer.get_app_dir("specli"))


def user_profile_dir() -> Path:
    return config_dir() / "profiles"


def _line(node) -> int:
    return node.start_mark.line + 1


def _fail(where: str, node, msg: str) -> SpecliError:
    return SpecliError(f"{where}:{_line(node)}: {msg}")


def _scalar(where, node, what) -> str:
    if not isinstance(node, yaml.ScalarNode) or not str(node.value).strip():
        raise _fail(where, node, f"{what} must be a non-empty string")
    return str(node.value)


def _model(where: str, node, what: str) -> ModelSpec:
    if isinstance(node, yaml.ScalarNode):
        return ModelSpec((_scalar(where, node, what),))
    if not isinstance(node, yaml.MappingNode):
        raise _fail(where, node, f"{what} must be a model reference or a mapping with 'sources'")
    sources: list[str] = []
    sha = size = None
    for k, v in node.value:
        key = k.value
        if key not in MODEL_KEYS:
            raise _fail(where, k, f"unknown key '{key}' in {what} (allowed: {', '.join(sorted(MODEL_KEYS))})")
        if key == "sources":
            if not isinstance(v, yaml.SequenceNode) or not v.value:
                raise _fail(where, v, f"{what}.sources must be a non-empty list of references")
            sources = [_scalar(where, s, f"{what}.sources entry") for s in v.value]
            if any(src in DRAFTERS for src in sources):
                raise _fail(where, v, "'mtp' and 'lookup' are drafters, not model sources: "
                                      "write them as a drafts entry of their own (drafts: [mtp])")
        elif key == "sha256":
            sha = _scalar(where, v, "sha256").lower()
            if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
                raise _fail(where, v, "sha256 must be 64 hexadecimal digits")
        else:
            try:
                size = int(_scalar(where, v, "size"))
            except ValueError:
                raise _fail(where, v, "size must be a number of bytes") from None
    if not sources:
        raise _fail(where, node, f"{what} needs 'sources'")
    return ModelSpec(tuple(sources), sha, size)


def parse_profile(text: str, where: str) -> Profile:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise SpecliError(f"{where}{line}: invalid YAML ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        raise SpecliError(f"{where}:1: a profile is a mapping with 'name' and 'target'")
    nodes = {}
    for k, v in root.value:
        if k.value not in TOP_KEYS:
            raise _fail(where, k, f"unknown key '{k.value}' (allowed: {', '.join(sorted(TOP_KEYS))})")
        nodes[k.value] = v
    for req in ("name", "target"):
        if req not in nodes:
            raise SpecliError(f"{where}:1: missing key '{req}'")
    name = _scalar(where, nodes["name"], "name")
    target = _model(where, nodes["target"], "target")
    if target.kind != "model":
        raise _fail(where, nodes["target"], f"target must be a model, not '{target.ref}' (that is a drafts entry)")
    drafts: list[ModelSpec] = []
    if "drafts" in nodes:
        dn = nodes["drafts"]
        items = dn.value if isinstance(dn, yaml.SequenceNode) else [dn]
        drafts = [_model(where, d, "drafts entry") for d in items]
    defaults = _defaults(where, nodes["defaults"], data) if "defaults" in nodes else {}
    desc = str(data.get("description", "") or "")
    hf = {k: _scalar(where, nodes[k], k) for k in ("hf_target", "hf_draft") if k in nodes}
    cpu = _model(where, nodes["cpu_target"], "cpu_target") if "cpu_target" in nodes else None
    if cpu is not None and cpu.kind != "model":
        raise _fail(where, nodes["cpu_target"], f"cpu_target must be a model, not '{cpu.ref}'")
    return Profile(name, target, drafts, defaults, desc, where, **hf, cpu_target=cpu)


def _defaults(where: str, dn, data: dict) -> dict:
    """A profile's ``defaults:``, keys checked against DEFAULT_KEYS."""
    if not isinstance(dn, yaml.MappingNode):
        raise _fail(where, dn, "defaults must be a mapping")
    for k, _ in dn.value:
        if k.value not in DEFAULT_KEYS:
            raise _fail(where, k, f"unknown key '{k.value}' in defaults (allowed: {', '.join(DEFAULT_KEYS)})")
    return dict(data.get("defaults") or {})


def _shipped() -> list[tuple[str, str]]:
    out = []
    for p in resources.files("specli.profiles").iterdir():
        if p.name.endswith((".yaml", ".yml")):
            out.append((f"{SHIPPED}{p.name}", p.read_text(encoding="utf-8")))
    return sorted(out)


def _read(path) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SpecliError(f"cannot read profile {path}: {e.strerror or e}") from None
    return decode_utf8(data, str(path), f"iconv -f {{enc}} -t UTF-8 {path} > fixed.yaml")


@functools.cache
def _shipped_profiles() -> dict[str, Profile]:
    """The profiles specli ships, parsed once a process (they change only with specli)."""
    out: dict[str, Profile] = {}
    for where, text in _shipped():
        prof = parse_profile(text, where)
        out[prof.name] = prof
    return out


def _load() -> tuple[dict[str, Profile], dict[str, SpecliError]]:
    """Every valid profile by name (a user's overrides a shipped one of the same name), and the
    user's files that do not parse: file stem -> the parser's one-line error."""
    out = {name: copy.deepcopy(prof) for name, prof in _shipped_profiles().items()}
    broken: dict[str, SpecliError] = {}
    d = user_profile_dir()
    for p in sorted(d.iterdir()) if d.is_dir() else []:
        if p.suffix not in (".yaml", ".yml"):
            continue
        try:
            prof = parse_profile(_read(p), str(p))
        except SpecliError as e:
            broken[p.stem] = e
            continue
        out[prof.name] = prof
    return out, broken


def _warn(msg: str) -> None:
    print(f"specli: {msg}", file=sys.stderr, flush=True)


# where notes about broken user profiles go (the CLI's stderr); each file is reported once a process
warn: Callable[[str], None] = _warn
_reported: set[str] = set()


def _report(broken: dict[str, SpecliError], skip: str | None = None) -> None:
    for stem, e in broken.items():
        if stem != skip and str(e) not in _reported:
            _reported.add(str(e))
            warn(f"ignoring a broken profile: {e}")


def load_all() -> dict[str, Profile]:
    """Every valid profile by name. A user's file that does not parse is left out (and reported
    once on stderr, with the parser's file:line), so it breaks nothing but itself."""
    profs, broken = _load()
    _report(broken)
    return profs


def is_path(name_or_path: str) -> bool:
    """A profile given as a file: one that exists, or a name ending in .yaml / .yml."""
    return name_or_path.lower().endswith((".yaml", ".yml")) or os.path.isfile(os.path.expanduser(name_or_path))


def load_file(path: str) -> Profile:
    full = os.path.expanduser(path)
    if not os.path.isfile(full):
        raise SpecliError(f"profile file not found: {path}")
    return parse_profile(_read(full), path)


def get(name_or_path: str) -> Profile:
    """A profile by name, or read from a YAML file when given a path (``./my-pair.yaml``). A
    broken user profile fails here only when it is the one asked for (its name is the file stem)."""
    if is_path(name_or_path):
        return load_file(name_or_path)
    profs, broken = _load()
    _report(broken, skip=name_or_path)
    prof = profs.get(name_or_path)
    if name_or_path in broken and (prof is None or prof.path.startswith(SHIPPED)):
        raise SpecliError(str(broken[name_or_path]))
    if prof is None:
        raise SpecliError(f"no profile named '{name_or_path}' (known: {', '.join(sorted(profs))}; "
                          "or give a path to a .yaml file)")
    return prof


def _names(src: str) -> set[str]:
    """Ways a source can be named: the reference itself, and the file name it resolves to."""
    from specli.resolve import hub, wheels
    s = src.lower()
    out = {s, s.removeprefix("pypi:")}
    w = wheels.BUILTIN.get(s.removeprefix("pypi:"))
    if w:
        out.add(w.filename.lower())
    h = hub.parse_hub_ref(src)
    if h and h.filename:
        out.add(os.path.basename(h.filename).lower())
    return out


def for_target(target_ref: str, target_path: str | None = None) -> Profile | None:
    """The profile whose target is this reference (or this file), if any."""
    want = {target_ref.lower(), target_ref.lower().removeprefix("pypi:")}
    base = os.path.basename(target_path).lower() if target_path else None
    for prof in load_all().values():
        if prof.name == target_ref:
            return prof
        for src in prof.target.sources:
            names = _names(src)
            if want & names or (base and any(base == n or base.endswith("-" + n) for n in names)):
                return prof
    return None

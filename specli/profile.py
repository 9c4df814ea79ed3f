"""Profiles: curated target/draft pairs with the draft settings that suit them (YAML, read with
``safe_load`` only). Shipped ones live in the package; users add their own in the platform
config directory (``~/.config/specli/profiles`` on Linux, or ``$SPECLI_CONFIG_DIR/profiles``).

A model entry is a reference string, or a mapping ``{sources: [ref, ...], sha256: HEX}``
whose sources are tried in order (the Hub first, a PyPI wheel second, say).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from .errors import SpecliError

TOP_KEYS = {"name", "description", "target", "drafts", "defaults"}
MODEL_KEYS = {"sources", "sha256", "size"}
# a profile's defaults: key (also the CLI option's name) -> the session option it fills
DEFAULTS = {"ctx": "n_ctx", "draft_max": "draft_max", "draft_p_min": "draft_p_min"}
DEFAULT_KEYS = set(DEFAULTS)


@dataclass(frozen=True)
class ModelSpec:
    sources: tuple[str, ...]
    sha256: str | None = None
    size: int | None = None

    @property
    def ref(self) -> str:
        return self.sources[0]


@dataclass
class Profile:
    name: str
    target: ModelSpec
    drafts: list[ModelSpec] = field(default_factory=list)
    defaults: dict = field(default_factory=dict)
    description: str = ""
    path: str = ""


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
    drafts: list[ModelSpec] = []
    if "drafts" in nodes:
        dn = nodes["drafts"]
        items = dn.value if isinstance(dn, yaml.SequenceNode) else [dn]
        drafts = [_model(where, d, "drafts entry") for d in items]
    defaults: dict = {}
    if "defaults" in nodes:
        dn = nodes["defaults"]
        if not isinstance(dn, yaml.MappingNode):
            raise _fail(where, dn, "defaults must be a mapping")
        for k, v in dn.value:
            if k.value not in DEFAULT_KEYS:
                raise _fail(where, k, f"unknown key '{k.value}' in defaults "
                                      f"(allowed: {', '.join(sorted(DEFAULT_KEYS))})")
        defaults = dict(data.get("defaults") or {})
    desc = str(data.get("description", "") or "")
    return Profile(name, target, drafts, defaults, desc, where)


def _shipped() -> list[tuple[str, str]]:
    out = []
    for p in resources.files("specli.profiles").iterdir():
        if p.name.endswith((".yaml", ".yml")):
            out.append((f"specli/profiles/{p.name}", p.read_text(encoding="utf-8")))
    return sorted(out)


def _user() -> list[tuple[str, str]]:
    d = user_profile_dir()
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.iterdir()):
        if p.suffix in (".yaml", ".yml"):
            try:
                out.append((str(p), p.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError) as e:
                raise SpecliError(f"cannot read profile {p}: {e}") from None
    return out


def load_all() -> dict[str, Profile]:
    """Every profile by name; a user's profile of the same name overrides a shipped one."""
    out: dict[str, Profile] = {}
    for where, text in _shipped() + _user():
        prof = parse_profile(text, where)
        out[prof.name] = prof
    return out


def get(name: str) -> Profile:
    profs = load_all()
    if name not in profs:
        raise SpecliError(f"no profile named '{name}' (known: {', '.join(sorted(profs))})")
    return profs[name]


def _names(src: str) -> set[str]:
    """Ways a source can be named: the reference itself, and the file name it resolves to."""
    from . import hub, wheels
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

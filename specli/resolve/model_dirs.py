"""Your own model folders: ``SPECLI_MODEL_DIRS`` and ``model_dirs:`` in config.yaml in specli's
config directory (``~/.config/specli``, or ``$SPECLI_CONFIG_DIR``)."""

from __future__ import annotations

import os
from pathlib import Path

from specli.errors import SpecliError
from specli.resolve.profiles import config_dir


def config_file() -> Path:
    return config_dir() / "config.yaml"


def user_dirs() -> list[Path]:
    """``SPECLI_MODEL_DIRS`` (``os.pathsep``-separated), then ``model_dirs`` in config.yaml."""
    out = [Path(os.path.expanduser(d)) for d in os.environ.get("SPECLI_MODEL_DIRS", "").split(os.pathsep) if d]
    path = config_file()
    if not path.is_file():
        return out
    import yaml
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise SpecliError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise SpecliError(f"{path}{f':{mark.line + 1}' if mark else ''}: invalid YAML "
                          f"({getattr(e, 'problem', None) or e})") from None
    if data is None:
        return out
    dirs = data.get("model_dirs", []) if isinstance(data, dict) else None
    if not isinstance(data, dict) or set(data) - {"model_dirs"} or not isinstance(dirs, list) or \
            not all(isinstance(d, str) and d for d in dirs):
        raise SpecliError(f"{path}: expected 'model_dirs:' with a list of folders (and no other key)")
    return out + [Path(os.path.expanduser(d)) for d in dirs]

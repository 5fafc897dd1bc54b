"""Where the shared routing data lives: ``--data``, else ``POINTSMAN_DATA_DIR``, else ``<repo>/../shared/data``."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "POINTSMAN_DATA_DIR"
REPO_ROOT = Path(__file__).resolve().parents[2]


def resolve_data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return the data directory, preferring an explicit path, then the environment, then the sibling default."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser().resolve()
    return (REPO_ROOT.parent / "shared" / "data").resolve()

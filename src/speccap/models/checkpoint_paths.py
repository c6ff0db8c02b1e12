"""Whether a role's model can be there, answered without loading torch or transformers: every
stage's preflight (speccap.preflight) asks it before its flow starts, and most stages' main
processes never load a model themselves."""

from __future__ import annotations

import os
from pathlib import Path

from ..config import ModelParams


class ModelLoadError(FileNotFoundError):
    pass


def checkpoint_missing(role: str, spec: ModelParams) -> str | None:
    """Why a real role's checkpoint cannot be there (None: it may be; embedded roles are the train
    stage's)."""
    if spec.backend == "embedded":
        return None
    param, path = f"models.{role}.path", spec.path
    if not path:
        return f"{param}: not set (backend {spec.backend} needs a local checkpoint path)"
    looks_local = path.startswith(("/", ".", "~")) or os.sep in path.strip("/").split("/", 1)[-1] or Path(path).exists()
    if looks_local and not Path(path).expanduser().exists():
        return f"{param}: checkpoint folder {path} not found"
    return None

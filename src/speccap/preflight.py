"""What a stage needs before it starts, checked before any flow runs: a missing input is one line
that names the param (or the stage to run first), not a traceback from deep inside a worker."""

from __future__ import annotations

from pathlib import Path

from .config import Params
from .data.manifest import ManifestError
from .data.mer2024 import Mer2024Error, mer2024_root, read_caption_table
from .data.trace_pool import PARAM as POOL_PARAM
from .data.trace_pool import TracePoolError
from .models.checkpoint_paths import ModelLoadError, checkpoint_missing
from .pipeline.splits import SPLITS, split_records

# the stages that load the edge and cloud models
MODEL_STAGES = ("decode", "trace_refs", "traces", "gates", "gate_eval", "promote", "wisv_head", "wisv_eval")

# the errors that mean bad or missing input: shown as their message alone
INPUT_ERRORS = (ManifestError, Mer2024Error, TracePoolError, ModelLoadError, FileNotFoundError)


def check_stage(params: Params, stage: str) -> None:
    """Raise one of INPUT_ERRORS, naming the param, when `stage` cannot start."""
    if stage == "prepare" and params.data.source == "mer2024":
        read_caption_table(mer2024_root(params.data.mer2024.path))
        pool = params.data.trace_pool.path
        if pool and not Path(pool).is_dir():
            raise TracePoolError(f"{POOL_PARAM}: trace pool folder {pool} not found")
    if stage in MODEL_STAGES:
        for role in ("edge", "cloud"):
            problem = checkpoint_missing(role, getattr(params.models, role))
            if problem:
                raise ModelLoadError(problem)
    if stage == "trace_refs":
        for split in SPLITS:
            for lang in params.data.languages:
                split_records(params, split, lang)

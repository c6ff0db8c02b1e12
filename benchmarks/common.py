"""What the benchmarks share: both models loaded once, the test clips with their features."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from speccap.config import Params
from speccap.data.featurize import load_clip_features
from speccap.data.manifest import manifest_path, read_manifest
from speccap.models.base import shared_vocab
from speccap.models.loading import load_role


def mean(xs) -> float:
    return statistics.fmean(xs) if xs else 0.0


def load_models(params: Params, threads: int):
    """(edge, cloud), sharing one vocabulary, at `threads` torch threads."""
    torch.set_num_threads(threads)
    edge, cloud = load_role(params, "edge"), load_role(params, "cloud")
    shared_vocab(edge, cloud)
    return edge, cloud


def models_and_test_clips(params: Params, n_clips: int | None, threads: int):
    """(edge, cloud, [(manifest record, language, log-mel)]): the first `n_clips` test clips per language."""
    edge, cloud = load_models(params, threads)
    clips = []
    for lang in params.data.languages:
        for rec in read_manifest(manifest_path(params.data.processed_dir, "test", lang))[:n_clips]:
            clips.append((rec, lang, load_clip_features(params.data.processed_dir, rec["id"])[0]))
    return edge, cloud, clips


def write_report(out: Path, result: dict, markdown: Callable[[dict], str]) -> None:
    """<out>.json and <out>.md of a benchmark's result; the markdown printed too."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    text = markdown(result)
    out.with_suffix(".md").write_text(text)
    print(text)

"""DVC stage `wisv_head`: WISV's decision head from hidden-state traces, as a Prefect flow.

The judged mismatches come from the on-policy traces of the `traces` stage (wisv.labels: shadow,
the default: every mismatch, judged as the deployed loop goes on, emotion hit in the impact), or
from traces of its own (wisv.labels: own: every block verified greedily, the hidden states at each
block's first mismatch, data/wisv_traces, per-clip records appended as they come: an interrupted
run resumes); the judged mismatches relabeled under drawn channels; the head trained, measured on validation, saved to
models/wisv/head.pt, logged and registered in MLflow under wisv.registry_name.
"""

from __future__ import annotations

import hashlib
import json

import pandas as pd
from prefect import flow
from tqdm import tqdm

from flows import stage_main
from speccap.config import load_params
from speccap.pipeline.saved import head_path
from speccap.pipeline.traces import collect, summary, trace_clips, trace_one, traces_key
from speccap.pipeline.wisv_head import WISV_TRACE_DIR, judged, shadow_traces, trace_settings, train_wisv_head
from speccap.pipeline.workers import Pool
from speccap.tracking import Tracker


@flow(name="speccap-wisv-head")
def wisv_head_flow(params_path: str | None = None) -> dict:
    params = load_params(params_path)
    w = params.wisv
    if w.labels == "shadow":  # the on-policy traces of the `traces` stage, shared with the token gates
        tables = shadow_traces(params)
        WISV_TRACE_DIR.mkdir(parents=True, exist_ok=True)  # a DVC output either way (empty here)
        key_of_traces = traces_key(params)  # the traces stage's own key
    else:
        settings = trace_settings(params)
        tables = _own_traces(params, params_path, settings)
        key_of_traces = traces_key(params, settings)
    report = train_wisv_head(params, tables["train"], tables["val"])
    report["labels"] = w.labels
    report["traces"] = summary(tables)
    path = head_path(params)
    key = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    report["head_key"] = key
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "wisv_head")
    ex = judged(tables["val"]).head(3)
    parts = [pd.DataFrame(ex["h_edge"].tolist()).add_prefix("e"), pd.DataFrame(ex["h_cloud"].tolist()).add_prefix("c"),
             pd.DataFrame([[1.3, 2.0, 0.05, 0.0]] * len(ex)).add_prefix("csi")]
    if w.scalars:
        parts.append(pd.DataFrame(ex["c_scalars"].tolist()).add_prefix("s"))
    example = pd.concat(parts, axis=1).astype("float32")
    metrics = {k: v for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    _, version = tracker.log_wisv_head(
        w.registry_name, f"wisv-head-{key}", path, example,
        {"wisv": {k: v for k, v in w.__dict__.items() if k != "channels"}, "traces_key": key_of_traces},
        metrics, artifacts=[path.parent / "head_vs_channel.png", path.parent / "calibration.png",
                                           path.with_suffix(".json")],
        tags={"stage": "wisv_head", "head_key": key})
    report["version"] = version
    (path.parent / "report.json").write_text(json.dumps(report, indent=1))
    return report


def _own_traces(params, params_path, settings) -> dict:
    """wisv.labels: own. Every block verified greedily, both states at each block's first mismatch,
    judged by the cloud finishing (data/wisv_traces, resumable)."""
    w = params.wisv
    total = sum(len(trace_clips(params, s, lang, w.traces)) for s in ("train", "val") for lang in params.data.languages)
    pool = Pool.for_stage(params, params_path, "wisv_head", fn=trace_one)
    bar = tqdm(total=total, desc="wisv traces", unit="clip")
    try:
        tables = collect(params, pool, WISV_TRACE_DIR, progress=bar.update, settings=settings, counts=w.traces)
    finally:
        bar.close()
        pool.close()
    for split, df in tables.items():
        df.to_parquet(WISV_TRACE_DIR / f"{split}.parquet", index=False)
    return tables


if __name__ == "__main__":
    stage_main(wisv_head_flow, "wisv_head")

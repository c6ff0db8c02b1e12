"""The fan-out shared by the decode, gate_eval and wisv_eval stages: configurations over a worker
pool, each one resumable (per-caption records on disk), logged as one nested MLflow run under the
sweep's parent run, FAILED with its error without stopping the others. A configuration whose
captions do not depend on its channel is relinked from the same one on the first channel
(speccap.decoding.relink) instead of decoded."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from prefect import get_run_logger, task
from tqdm import tqdm

from speccap.config import Params
from speccap.fanout import WorkerDied
from speccap.pipeline.sweep import RunConfig, config_key, link_config, models_fingerprint, relink_source, run_config, summarize
from speccap.pipeline.workers import Pool
from speccap.project import portable_arg
from speccap.tracking import Tracker

_POOL: dict = {}


@task(name="sweep-config", retries=1, retry_delay_seconds=1)
def sweep_config(cfg: RunConfig, key: str, clips: list[dict], runs_dir: str, relink_from=None) -> dict:
    # a retry resumes: records already on disk are not captioned again
    bar = tqdm(total=len(clips), desc=cfg.name, unit="clip", leave=False)
    records = run_config(cfg, clips, _POOL["pool"], Path(runs_dir) / f"{key}.jsonl", progress=bar.update,
                         relink_from=relink_from)
    bar.close()
    return summarize(cfg, records, clips)


def run_sweep(params: Params, params_path: str | None, stage: str, configs: list[RunConfig],
              clips: dict[str, list[dict]] | Callable[[RunConfig], list[dict]], runs_dir: str, extra_fp: str = "",
              run_tags=None) -> dict:
    """Run `configs` on their clips (per language, or `clips(cfg)` per configuration); returns
    {sweep_key, models, tracking_uri, configs: [...]}. `run_tags(cfg)` adds params to a
    configuration's MLflow run (e.g. the budget of a gate)."""
    log = get_run_logger()
    fp = models_fingerprint(params) + extra_fp
    clips_of = {c: (clips(c) if callable(clips) else clips[c.language]) for c in configs}
    keys = {c: config_key(c, params, fp, [x["id"] for x in clips_of[c]]) for c in configs}
    # a configuration whose captions do not depend on the channel is decoded on one channel and
    # relinked onto the others (its source runs first; on Dask every configuration decodes)
    sources = {c: s for c in configs if (s := relink_source(c, params)) in keys and clips_of[s] == clips_of[c]}
    configs = sorted(configs, key=lambda c: c in sources)
    sweep_key = hashlib.sha256(json.dumps([stage] + sorted(keys.values())).encode()).hexdigest()[:12]
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, stage)
    summary = {"sweep_key": sweep_key, "models": fp, "tracking_uri": portable_arg(tracker.uri), "configs": []}
    sweep_params = {"data.source": params.data.source, "decode": params.decode.__dict__,
                    "link": params.link.__dict__, "sweep": params.sweep.__dict__, "models_fingerprint": fp,
                    "edge": params.models.edge.backend, "cloud": params.models.cloud.backend}
    on_dask = None
    if params.cluster.executor == "dask":  # every configuration at once on the cluster; logged below
        from flows.cluster import run_on_dask
        on_dask = run_on_dask(params, params_path, [(c, keys[c], clips_of[c]) for c in configs], runs_dir)
        _POOL["pool"] = None
    else:
        _POOL["pool"] = Pool.for_stage(params, params_path, stage)
    try:
        with tracker.sweep(f"{stage}-sweep-{sweep_key}", sweep_params, {"sweep_key": sweep_key, "stage": stage}) as parent:
            summary["parent_run_id"] = parent
            done = tracker.finished(parent)
            for cfg in tqdm(configs, desc=stage, unit="config"):
                key = keys[cfg]
                extra = run_tags(cfg) if run_tags else {}
                row = {"config_id": key, "name": cfg.name, **cfg.to_dict(), **extra, "clips": len(clips_of[cfg])}
                link = link_config(params, cfg)
                run_params = cfg.to_dict() | extra | {
                    "link": link.name, "rtt_ms": link.rtt_ms, "uplink_mbps": link.uplink_mbps,
                    "clips": len(clips_of[cfg]), "max_new_tokens": params.models.max_new_tokens}
                try:
                    if on_dask is None:
                        relink_from = ((Path(runs_dir) / f"{keys[sources[cfg]]}.jsonl", link, params.seed)
                                       if cfg in sources else None)
                        metrics = sweep_config(cfg, key, clips_of[cfg], runs_dir, relink_from)
                        if cfg in sources:
                            row["relinked_from"] = keys[sources[cfg]]
                    elif isinstance(on_dask[key], dict):
                        metrics = on_dask[key]["metrics"]
                        row["worker"] = on_dask[key]["worker"]
                    else:
                        raise RuntimeError(on_dask[key])
                except WorkerDied:
                    raise  # the stage stops: its records so far stay, a re-run continues
                except Exception as exc:  # noqa: BLE001 - recorded as a FAILED run; the sweep goes on
                    log.error(f"{cfg.name} failed: {exc}")
                    if key not in done:
                        tracker.log_config(parent, key, cfg.name, run_params, {}, error=str(exc))
                    summary["configs"].append(row | {"status": "FAILED", "error": str(exc)})
                    continue
                clip_stats = metrics.pop("clip_stats", None)  # per-clip numbers: in the summary, not MLflow
                if key not in done:
                    positions = metrics.pop("position_acceptance", [])
                    tracker.log_config(parent, key, cfg.name, run_params, metrics,
                                       artifacts=[Path(runs_dir) / f"{key}.jsonl"],
                                       series={"position_acceptance": positions})
                    metrics["position_acceptance"] = positions
                summary["configs"].append(row | {"status": "FINISHED", "metrics": metrics, "clip_stats": clip_stats})
    finally:
        pool = _POOL.pop("pool")
        if pool is not None:
            pool.close()
    failed = [c["name"] for c in summary["configs"] if c["status"] == "FAILED"]
    log.info(f"{len(configs) - len(failed)} configurations finished, {len(failed)} failed {failed}")
    return summary

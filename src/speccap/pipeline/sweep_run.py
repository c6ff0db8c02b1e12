"""Running a sweep, shared by the decode, gate_eval and wisv_eval stages: configurations over a worker
pool, each one resumable (per-caption records on disk), logged as one nested MLflow run under the
sweep's parent run, FAILED with its error without stopping the others. A configuration whose
captions do not depend on its channel is relinked from the same one on the first channel
(speccap.decoding.relink) instead of decoded.

The orchestrator lends a sweep what the core does not know (`SweepHooks`): the flows wrap each
configuration in a Prefect task with a retry and run `cluster.executor: dask` on Prefect's Dask runner."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from ..config import Params
from ..fanout import WorkerDied
from ..metrics.system import ResourceMonitor
from ..project import portable_arg
from ..tracking import Tracker
from .sweep import (
    RunConfig,
    config_key,
    link_config,
    models_fingerprint,
    prune_logs,
    relink_source,
    run_config,
    summarize,
)
from .workers import Pool

# cluster(params, params_path, [(config, key, clips)], runs_dir) -> {key: {"metrics", "worker"} or an error text}
Cluster = Callable[[Params, "str | None", list, str], dict]


def _as_is(fn: Callable) -> Callable:
    return fn


@dataclass(frozen=True)
class SweepHooks:
    """`task(fn)`: how the captioning of one configuration runs (the flows: a Prefect task that retries
    once, resuming from the records on disk); `cluster`: every configuration at once on a cluster,
    needed by `cluster.executor: dask`; `log`: where the sweep says what finished and what failed."""
    task: Callable[[Callable], Callable] = _as_is
    cluster: Cluster | None = None
    log: logging.Logger | logging.LoggerAdapter = field(default_factory=lambda: logging.getLogger(__name__))


def run_sweep(params: Params, params_path: str | None, stage: str, configs: list[RunConfig],
              clips: dict[str, list[dict]] | Callable[[RunConfig], list[dict]], runs_dir: str, extra_fp: str = "",
              run_tags=None, hooks: SweepHooks = SweepHooks(), keep_also: tuple[str, ...] = ()) -> dict:
    """Run `configs` on their clips (per language, or `clips(cfg)` per configuration); returns
    {sweep_key, models, tracking_uri, configs: [...]}. `run_tags(cfg)` adds params to a
    configuration's MLflow run (e.g. the budget of a gate). Once every configuration has run, the
    runs folder holds their record logs and the files named in `keep_also` alone (prune_logs)."""
    fp = models_fingerprint(params) + extra_fp
    clips_of = {c: (clips(c) if callable(clips) else clips[c.language]) for c in configs}
    keys = {c: config_key(c, params, fp, [x["id"] for x in clips_of[c]]) for c in configs}
    # a configuration whose captions do not depend on the channel is decoded on one channel and
    # relinked onto the others (its source runs first; on a cluster every configuration decodes)
    sources = {c: s for c in configs if (s := relink_source(c, params)) in keys and clips_of[s] == clips_of[c]}
    configs = sorted(configs, key=lambda c: c in sources)
    sweep_key = hashlib.sha256(json.dumps([stage] + sorted(keys.values())).encode()).hexdigest()[:12]
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, stage)
    summary = {"sweep_key": sweep_key, "models": fp, "tracking_uri": portable_arg(tracker.uri), "configs": []}
    sweep_params = {"data.source": params.data.source, "decode": params.decode.__dict__,
                    "link": params.link.__dict__, "sweep": params.sweep.__dict__, "models_fingerprint": fp,
                    "edge": params.models.edge.backend, "cloud": params.models.cloud.backend}
    on_cluster, pool = None, None
    if params.cluster.executor == "dask":  # every configuration at once on the cluster; logged below
        if hooks.cluster is None:
            raise ValueError(f"params cluster.executor: dask, but stage {stage} was run without a cluster runner "
                             f"(run it through its flow, `python -m flows.{stage}`)")
        on_cluster = hooks.cluster(params, params_path, [(c, keys[c], clips_of[c]) for c in configs], runs_dir)
    else:
        pool = Pool.for_stage(params, params_path, stage)

    def caption(cfg: RunConfig, key: str, clips: list[dict], runs_dir: str, relink_from=None) -> dict:
        bar = tqdm(total=len(clips), desc=cfg.name, unit="clip", leave=False)
        records = run_config(cfg, clips, pool, Path(runs_dir) / f"{key}.jsonl", progress=bar.update,
                             relink_from=relink_from)
        bar.close()
        return summarize(cfg, records, clips)

    caption = hooks.task(caption)
    try:
        with (tracker.sweep(f"{stage}-sweep-{sweep_key}", sweep_params, {"sweep_key": sweep_key, "stage": stage})
              as parent, ResourceMonitor() as mon):
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
                    if on_cluster is None:
                        relink_from = ((Path(runs_dir) / f"{keys[sources[cfg]]}.jsonl", link, params.seed)
                                       if cfg in sources else None)
                        metrics = caption(cfg, key, clips_of[cfg], runs_dir, relink_from)
                        if cfg in sources:
                            row["relinked_from"] = keys[sources[cfg]]
                    elif isinstance(on_cluster[key], dict):
                        metrics = on_cluster[key]["metrics"]
                        row["worker"] = on_cluster[key]["worker"]
                    else:
                        raise RuntimeError(on_cluster[key])
                except WorkerDied:
                    raise  # the stage stops: its records so far stay, a re-run continues
                except Exception as exc:  # noqa: BLE001 - recorded as a FAILED run; the sweep goes on
                    hooks.log.error(f"{cfg.name} failed: {exc}")
                    if key not in done:
                        tracker.log_config(parent, key, cfg.name, run_params, {}, error=str(exc))
                    summary["configs"].append(row | {"status": "FAILED", "error": str(exc)})
                    continue
                summary["configs"].append(row | {"status": "FINISHED", **_logged(tracker, parent, done, key, cfg,
                                                                                run_params, metrics, runs_dir)})
    finally:
        if pool is not None:
            pool.close()
    prune_logs(Path(runs_dir), {f"{k}.jsonl" for k in keys.values()} | set(keep_also))
    return _closed(summary, tracker, mon, hooks)


def _closed(summary: dict, tracker: Tracker, mon: ResourceMonitor, hooks: SweepHooks) -> dict:
    """The sweep's summary, once its stage's GPU figures are logged to its own run and its outcome said."""
    # the device's figures over the whole stage, whichever of its processes used it (none without a GPU)
    if stage_gpu := {f"stage_{k}": v for k, v in mon.gpu_summary().items()}:
        tracker.log_metrics(summary["parent_run_id"], stage_gpu)
    failed = [c["name"] for c in summary["configs"] if c["status"] == "FAILED"]
    hooks.log.info(f"{len(summary['configs']) - len(failed)} configurations finished, {len(failed)} failed {failed}")
    return summary


def _logged(tracker: Tracker, parent: str, done: set, key: str, cfg: RunConfig, run_params: dict, metrics: dict,
            runs_dir: str) -> dict:
    """A finished configuration's MLflow run (unless an earlier run of the sweep logged it) and its summary
    row's metrics; the per-clip numbers go to the summary only, not MLflow."""
    clip_stats = metrics.pop("clip_stats", None)
    if key not in done:
        positions = metrics.pop("position_acceptance", [])
        tracker.log_config(parent, key, cfg.name, run_params, metrics, artifacts=[Path(runs_dir) / f"{key}.jsonl"],
                           series={"position_acceptance": positions})
        metrics["position_acceptance"] = positions
    return {"metrics": metrics, "clip_stats": clip_stats}

"""DVC stage `decode`: the sweep of edge-only, cloud-only and UGSD configurations, as a Prefect flow.

One MLflow parent run per sweep (resumed, not duplicated, on a rerun of the same sweep), one
nested run per configuration with params, metrics and the per-caption records. A configuration
that fails is logged FAILED with its error and the others go on; finished ones are not redone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from prefect import flow, get_run_logger, task
from tqdm import tqdm

from speccap.config import load_params
from speccap.pipeline.sweep import (Pool, RunConfig, build_configs, config_key, models_fingerprint, run_config,
                                    summarize, eval_clips)
from speccap.tracking import Tracker

SUMMARY = Path("reports/decode_summary.json")


@task(name="decode-config", retries=1, retry_delay_seconds=1)
def decode_config(cfg: RunConfig, key: str, clips: list[dict], runs_dir: str) -> dict:
    # a retry resumes: records already on disk are not captioned again
    bar = tqdm(total=len(clips), desc=cfg.name, unit="clip", leave=False)
    records = run_config(cfg, clips, _POOL["pool"], Path(runs_dir) / f"{key}.jsonl", progress=bar.update)
    bar.close()
    return summarize(cfg, records, clips)


_POOL: dict = {}


@flow(name="speccap-decode")
def decode_flow(params_path: str | None = None) -> dict:
    log = get_run_logger()
    params = load_params(params_path)
    configs = build_configs(params)
    fp = models_fingerprint(params)
    clips = {lang: eval_clips(params, lang) for lang in params.data.languages}
    keys = {c: config_key(c, params, fp, [x["id"] for x in clips[c.language]]) for c in configs}
    sweep_key = hashlib.sha256(json.dumps(sorted(keys.values())).encode()).hexdigest()[:12]
    tracker = Tracker(params.tracking.uri, params.tracking.experiment)
    summary = {"sweep_key": sweep_key, "models": fp, "tracking_uri": tracker.uri, "configs": []}
    sweep_params = {"data.source": params.data.source, "decode": params.decode.__dict__,
                    "link": params.link.__dict__, "sweep": params.sweep.__dict__, "models_fingerprint": fp,
                    "edge": params.models.edge.backend, "cloud": params.models.cloud.backend}
    _POOL["pool"] = Pool(params_path, params.sweep.workers, params.sweep.threads)
    try:
        with tracker.sweep(f"decode-sweep-{sweep_key}", sweep_params, {"sweep_key": sweep_key, "stage": "decode"}) as parent:
            done = tracker.finished(parent)
            for cfg in tqdm(configs, desc="sweep", unit="config"):
                key = keys[cfg]
                row = {"config_id": key, "name": cfg.name, **cfg.to_dict()}
                run_params = cfg.to_dict() | {"link": params.link.name, "rtt_ms": params.link.rtt_ms,
                                              "uplink_mbps": params.link.uplink_mbps, "clips": len(clips[cfg.language]),
                                              "max_new_tokens": params.models.max_new_tokens}
                try:
                    metrics = decode_config(cfg, key, clips[cfg.language], params.sweep.runs_dir)
                except Exception as exc:  # noqa: BLE001 - recorded as a FAILED run; the sweep goes on
                    log.error(f"{cfg.name} failed: {exc}")
                    if key not in done:
                        tracker.log_config(parent, key, cfg.name, run_params, {}, error=str(exc))
                    summary["configs"].append(row | {"status": "FAILED", "error": str(exc)})
                    continue
                if key not in done:
                    positions = metrics.pop("position_acceptance", [])
                    tracker.log_config(parent, key, cfg.name, run_params, metrics,
                                       artifacts=[Path(params.sweep.runs_dir) / f"{key}.jsonl"],
                                       series={"position_acceptance": positions})
                    metrics["position_acceptance"] = positions
                summary["configs"].append(row | {"status": "FINISHED", "metrics": metrics})
    finally:
        _POOL.pop("pool").close()
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    failed = [c["name"] for c in summary["configs"] if c["status"] == "FAILED"]
    log.info(f"{len(configs) - len(failed)} configurations finished, {len(failed)} failed {failed}")
    return {"configs": len(configs), "failed": failed}


if __name__ == "__main__":
    print(decode_flow())

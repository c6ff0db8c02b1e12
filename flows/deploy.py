"""Prefect deployments of the pipeline and the sweep flows, for a process work pool (a login node).

    python -m flows.deploy [--pool speccap-login] [--flows pipeline decode gate_eval wisv_eval]
                           [--cron "0 2 * * *"] [--params params.yaml] [--set decode.block_len=7 ...]

Creates the process work pool if it is missing, then one deployment per flow, named after it
(`speccap-pipeline/pipeline`, `speccap-decode/decode`, `speccap-gate-eval/gate_eval`,
`speccap-wisv-eval/wisv_eval`), running from
this checkout. Their parameters map to params.yaml: `params_path`, and `overrides` (dotted keys
applied on top of the file, validated like it; e.g. {"decode.block_len": 7, "cluster.executor": "dask"}).
The pipeline runs nightly by default (DEFAULT_CRON); the sweeps run on a schedule only with --cron.
Then, on the login node: `prefect worker start --pool speccap-login`; a run now:
`prefect deployment run speccap-decode/decode -p overrides='{"decode.block_len": 7}'`. See docs/hpc.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CRON = "0 2 * * *"  # the whole pipeline, nightly at 02:00 (server time zone)
FLOWS = {
    "pipeline": ("flows/pipeline.py:pipeline_flow", DEFAULT_CRON),
    "decode": ("flows/decode.py:decode_flow", None),
    "gate_eval": ("flows/gate_eval.py:gate_eval_flow", None),
    "wisv_eval": ("flows/wisv_eval.py:wisv_eval_flow", None),
}


async def _ensure_pool(name: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    async with get_client() as client:
        try:
            await client.create_work_pool(WorkPoolCreate(name=name, type="process"))
        except ObjectAlreadyExists:
            pass


def parse_overrides(items: list[str]) -> dict:
    """["decode.block_len=7", "cluster.executor=dask"] -> {"decode.block_len": 7, ...} (values as YAML)."""
    import yaml
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE, e.g. decode.block_len=7")
        out[key.strip()] = yaml.safe_load(value)
    return out


def deploy(names: list[str], pool: str = "speccap-login", cron: str | None = None, params_path: str = "params.yaml",
           overrides: dict | None = None, source: Path = ROOT) -> list[str]:
    """Create (or update) the deployments; returns their ids. `cron` replaces each flow's default
    schedule; flows with neither run on demand only."""
    from prefect import flow

    from speccap.config import load_params
    unknown = [n for n in names if n not in FLOWS]
    if unknown:
        raise SystemExit(f"unknown flow(s) {unknown}; have {sorted(FLOWS)}")
    load_params(Path(source) / params_path if not Path(params_path).is_absolute() else params_path,
                overrides)  # a bad key fails now, not at 2 a.m.
    asyncio.run(_ensure_pool(pool))
    ids = []
    for name in names:
        entrypoint, default_cron = FLOWS[name]
        remote = flow.from_source(source=str(source), entrypoint=entrypoint)
        schedule = cron or default_cron
        ids.append(str(remote.deploy(name=name, work_pool_name=pool, cron=schedule, build=False, push=False,
                                     parameters={"params_path": params_path, "overrides": overrides or {}},
                                     description=f"speccap {name} from {source}", tags=["speccap"],
                                     print_next_steps=False)))
    return ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", default="speccap-login", help="process work pool (created if missing)")
    ap.add_argument("--flows", nargs="+", default=list(FLOWS), choices=list(FLOWS))
    ap.add_argument("--cron", help=f"schedule for every deployment made (default: pipeline {DEFAULT_CRON}, "
                                   "sweeps on demand)")
    ap.add_argument("--params", default="params.yaml", help="params file, relative to the project root")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="params overrides, dotted keys")
    a = ap.parse_args(argv)
    ids = deploy(a.flows, a.pool, a.cron, a.params, parse_overrides(a.set))
    print(json.dumps(dict(zip(a.flows, ids)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

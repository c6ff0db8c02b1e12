"""Typed view of params.yaml: the one place that reads the file.

Every stage, flow and command gets its knobs from `load_params()`. Unknown keys and wrong
types fail at load time with the dotted key path, so a typo in params.yaml never silently
falls back to a default. A `profile` key selects a block under `profiles:` whose keys are
merged over the top-level ones (the CI profile is the same pipeline with smaller sizes). The
schema lives in params_schema.py; what each DVC stage reads of it, in stage_params.py.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from .params_schema import (
    DecodeParams,
    GateName,
    LinkConfig,
    MarkovParams,
    ModelParams,
    Params,
    RuleName,
    ThinkerSize,
    TrainParams,
    VerifyName,
)

PARAMS_ENV = "SPECCAP_PARAMS"


class ConfigError(ValueError):
    """params.yaml is missing, malformed, or names an unknown / mistyped key."""


# the schema's types, read through this module like the values
__all__ = ["ConfigError", "PARAMS_ENV", "load_params", "params_from_dict", "materialize", "gate_decode",
           "Params", "LinkConfig", "ThinkerSize", "TrainParams", "ModelParams", "MarkovParams", "DecodeParams",
           "RuleName", "GateName", "VerifyName"]


_PARAMS = TypeAdapter(Params)




def _build(raw: dict) -> "Params":
    """Params from the resolved mapping; pydantic's errors as one line naming each dotted key."""
    try:
        return _PARAMS.validate_python(raw)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            key = ".".join(str(p) for p in e["loc"] if p not in ("function-after", "dataclass-args"))
            if e["type"] == "unexpected_keyword_argument":
                problems.append(f"unknown key in params: {key}")
            else:
                problems.append(f"params key {key}: {e['msg']}, got {e.get('input')!r}")
        raise ConfigError("; ".join(problems)) from None


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base.get(k) or {}, v) if isinstance(v, dict) else v
    return out


def _validate(p: Params) -> None:
    if not p.data.languages:
        raise ConfigError("params key data.languages: name at least one caption language (en, zh)")
    for name in ("train_per_language", "val_per_language", "test_per_language", "references_per_clip", "workers"):
        if getattr(p.data.synthetic, name) < 1:
            raise ConfigError(f"params key data.synthetic.{name} must be >= 1")
    if not 0 < p.data.synthetic.cue_spread <= 2:
        raise ConfigError(f"params key data.synthetic.cue_spread must be in (0, 2], got {p.data.synthetic.cue_spread}")
    if p.data.max_clip_seconds <= 0:
        raise ConfigError("params key data.max_clip_seconds must be > 0")
    if not 0 < p.data.trace_pool.val_share < 1:
        raise ConfigError(f"params key data.trace_pool.val_share must be in (0, 1), got {p.data.trace_pool.val_share}")
    if p.data.trace_pool.path and p.data.source != "mer2024":
        raise ConfigError("params key data.trace_pool.path: a trace pool is for data.source mer2024 (the synthetic "
                          "corpus has referenced train and validation clips of its own)")
    if p.data.cross_fit.folds < 3:
        raise ConfigError(f"params key data.cross_fit.folds must be >= 3 (a fold to test, one to threshold on, "
                          f"one or more to train on), got {p.data.cross_fit.folds}")
    if p.data.cross_fit.when == "always" and p.data.trace_pool.path:
        raise ConfigError("params key data.cross_fit.when: always cross-fits over the referenced clips, and "
                          "data.trace_pool.path gives clips to learn from instead: set one of them")
    if p.data.source == "mer2024":
        embedded = [r for r in ("edge", "cloud") if getattr(p.models, r).backend == "embedded"]
        if embedded:
            raise ConfigError(f"params key models.{embedded[0]}.backend: embedded captioners train on the synthetic "
                              "corpus; with data.source mer2024 point it at a Qwen-Omni checkpoint "
                              f"(backend qwen2_5_omni or qwen3_omni_moe, models.{embedded[0]}.path)")
    for role in ("edge", "cloud"):
        m = getattr(p.models, role)
        if m.backend != "embedded" and not m.path:
            raise ConfigError(f"params key models.{role}.path: backend {m.backend} needs a local path or hub id")
        if m.size.text_hidden % m.size.text_heads or m.size.text_heads % m.size.text_kv_heads:
            raise ConfigError(f"params keys models.{role}.size: text_hidden must divide by text_heads, "
                              "and text_heads by text_kv_heads")
    if p.decode.rule in ("spec_sampling", "qs", "sq") and p.decode.temperature <= 0:
        raise ConfigError(f"params key decode.temperature: {p.decode.rule} needs sampling (temperature > 0)")
    if p.qs.level < 1 or not p.qs.levels or min(p.qs.levels) < 1 or p.qs.l_max < 1:
        raise ConfigError("params keys qs.level, qs.levels, qs.l_max must be >= 1")
    if any(v < 0 for v in p.sweep.qs_levels) or (p.sweep.qs_levels and p.sweep.qs_temperature <= 0):
        raise ConfigError("params keys sweep.qs_levels (>= 0; 0 = adaptive) / sweep.qs_temperature (> 0)")
    if p.decode.block_len < 0 or p.decode.rank < 1:
        raise ConfigError("params keys decode.block_len (>= 0, 0 = adaptive) / decode.rank (>= 1)")
    if p.decode.in_flight < 0 or any(n < 0 for n in p.sweep.in_flight):
        raise ConfigError("params keys decode.in_flight / sweep.in_flight: blocks in flight must be >= 0")
    if p.decode.edge_time_scale <= 0 or p.decode.cloud_time_scale <= 0:
        raise ConfigError("params keys decode.edge_time_scale / decode.cloud_time_scale must be > 0")
    g = p.gates
    if not g.targets or len(set(g.targets)) != len(g.targets):
        raise ConfigError(f"params key gates.targets: one or more distinct targets, the main one first; got {list(g.targets)}")
    if g.impact_weight < 0:
        raise ConfigError(f"params key gates.impact_weight: must be >= 0, got {g.impact_weight}")
    if any(k < 1 for k in g.oracle_corrections):
        raise ConfigError(f"params key gates.oracle_corrections: corrections per caption must be >= 1, got "
                          f"{list(g.oracle_corrections)}")
    if any(r < 1 for r in g.verify_ranks):
        raise ConfigError(f"params key gates.verify_ranks: R of the rank rule must be >= 1, got {list(g.verify_ranks)}")
    if not g.budgets or any(not 0 < b <= 1 for b in g.budgets) or not 0 < g.promote_budget <= 1:
        raise ConfigError("params keys gates.budgets / gates.promote_budget: escalation rates in (0, 1]")
    if any(length < 0 for length in p.sweep.block_lens) or p.sweep.workers < 0 or p.sweep.threads < 1:
        raise ConfigError("params keys sweep.block_lens (>= 0), sweep.workers (>= 0), sweep.threads (>= 1)")
    if p.features.hop_length < 1 or p.features.n_fft < p.features.hop_length:
        raise ConfigError("params keys features.hop_length / features.n_fft: need 1 <= hop_length <= n_fft")
    d, sl = p.cluster.dask, p.cluster.slurm
    if d.workers < 1 or d.threads_per_worker < 1 or d.adapt_minimum < 0 or 0 < d.adapt_maximum < d.adapt_minimum:
        raise ConfigError("params keys cluster.dask.*: workers and threads_per_worker >= 1, "
                          "0 <= adapt_minimum <= adapt_maximum (0 = no adaptive scaling)")
    w = p.wisv
    if not 0 <= w.tau <= 1 or not 0 <= w.budget_min <= w.budget_max <= 1 or not 0 <= w.kappa < 1:
        raise ConfigError("params keys wisv.tau (in [0, 1]), wisv.budget_min <= wisv.budget_max (in [0, 1]), "
                          "wisv.kappa (in [0, 1))")
    if w.rank < 0 or w.patience < 0 or w.weight_decay < 0 or w.critical_weight < 0:
        raise ConfigError("params keys wisv.rank, wisv.patience, wisv.weight_decay, wisv.critical_weight "
                          "must be >= 0")
    if w.csi_draws < 1 or w.hidden < 1 or w.epochs < 1 or not w.block_lens or min(w.block_lens) < 1 \
            or w.traces.block_len < 1 or not w.channels:
        raise ConfigError("params keys wisv.csi_draws, wisv.hidden, wisv.epochs, wisv.block_lens, "
                          "wisv.traces.block_len must be >= 1 and wisv.channels non-empty")
    if w.max_rank < 0 or w.max_rank == 1:
        raise ConfigError(f"params key wisv.max_rank: 0 (no cap) or >= 2, got {w.max_rank}")
    if not w.verify_ranks or min(w.verify_ranks) < 2 or len(set(w.verify_ranks)) != len(w.verify_ranks):
        raise ConfigError(f"params key wisv.verify_ranks: distinct R >= 2 (R = 1 is greedy), got {list(w.verify_ranks)}")
    for name, ch in w.channels.items():
        if ch.uplink_mbps <= 0 or ch.downlink_mbps <= 0 or ch.rtt_ms < 0 or not 0 <= ch.packet_error_rate < 1:
            raise ConfigError(f"params key wisv.channels.{name}: rates must be > 0, RTT >= 0, loss in [0, 1)")
    if sl.cores < 1 or sl.gpus < 0:
        raise ConfigError("params keys cluster.slurm.cores (>= 1) / cluster.slurm.gpus (>= 0)")


def _dotted(overrides: dict) -> dict:
    """{"decode.block_len": 7} -> {"decode": {"block_len": 7}}."""
    out: dict = {}
    for key, value in overrides.items():
        parts = str(key).split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key}: {part} is both a value and a section")
        node[parts[-1]] = value
    return out


def _resolved_raw(raw: dict, overrides: dict | None) -> dict:
    """The params mapping as a run sees it: its profile merged in (`profiles:` dropped), then the
    dotted `overrides` (which may name the profile themselves)."""
    raw = dict(raw or {})
    profiles = raw.pop("profiles", {}) or {}
    profile = (overrides or {}).get("profile", raw.get("profile", "default"))
    if profile != "default":
        if profile not in profiles:
            raise ConfigError(f"params key profile: {profile!r} has no block under profiles: (have {sorted(profiles)})")
        raw = _merge(raw, profiles[profile])
    return _merge(raw, _dotted(overrides)) if overrides else raw


def params_from_dict(raw: dict, overrides: dict | None = None) -> Params:
    """Params from a params.yaml mapping: the profile applied, then `overrides` (dotted keys, e.g.
    from a Prefect deployment's parameters), validated like the file itself."""
    if not isinstance(raw, dict):
        raise ConfigError(f"params: expected a mapping, got {type(raw).__name__}")
    params = _build(_resolved_raw(raw, overrides))
    _validate(params)
    return params


def load_params(path: str | os.PathLike | None = None, overrides: dict | None = None) -> Params:
    """Read params.yaml (or $SPECCAP_PARAMS, or `path`) into a validated `Params`; `overrides`:
    dotted keys applied after the profile (an unknown key is an error naming it)."""
    path = Path(path or os.environ.get(PARAMS_ENV, "params.yaml"))
    if not path.is_file():
        raise ConfigError(f"{path}: params file not found (run from the project root or set {PARAMS_ENV})")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return params_from_dict(raw or {}, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def materialize(path: str | os.PathLike | None, overrides: dict | None, out_dir: str | os.PathLike = ".speccap") -> str:
    """A params file equal to `path` with `overrides` applied (profile resolved), for processes that
    read params by path (sweep workers, Dask workers); `path` itself when there is nothing to apply."""
    import hashlib
    import json
    src = Path(path or os.environ.get(PARAMS_ENV, "params.yaml"))
    if not overrides:
        return str(src)
    load_params(src, overrides)  # fails here, naming the file and the key, before anything starts
    raw = _resolved_raw(yaml.safe_load(src.read_text(encoding="utf-8")) or {}, overrides)
    raw["profile"] = "default"  # already merged in; the written file has no profiles to pick from
    text = yaml.safe_dump(raw, sort_keys=True, allow_unicode=True)
    out = Path(out_dir) / f"params-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        out.write_text(f"# {src} with overrides {json.dumps(overrides, sort_keys=True)}\n" + text, encoding="utf-8")
    return str(out)


def gate_decode(p: Params) -> DecodeParams:
    """The decode settings gates are evaluated and promoted at: params.decode with the block length
    the traces (and so the thresholds) were made with."""
    return dataclasses.replace(p.decode, block_len=p.gates.traces.block_len)

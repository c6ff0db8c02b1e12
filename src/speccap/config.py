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
    """The rules that tie fields together (each field's own type and bounds are the schema's)."""
    d, m = p.data, p.models
    if d.trace_pool.path and d.source != "mer2024":
        raise ConfigError("params key data.trace_pool.path: a trace pool is for data.source mer2024 (the synthetic "
                          "corpus has referenced train and validation clips of its own)")
    if d.cross_fit.when == "always" and d.trace_pool.path:
        raise ConfigError("params key data.cross_fit.when: always cross-fits over the referenced clips, and "
                          "data.trace_pool.path gives clips to learn from instead: set one of them")
    embedded = [r for r in ("edge", "cloud") if getattr(m, r).backend == "embedded"]
    if d.source == "mer2024" and embedded:
        raise ConfigError(f"params key models.{embedded[0]}.backend: embedded captioners train on the synthetic "
                          "corpus; with data.source mer2024 point it at a Qwen-Omni checkpoint "
                          f"(backend qwen2_5_omni or qwen3_omni_moe, models.{embedded[0]}.path)")
    for role in ("edge", "cloud"):
        r = getattr(m, role)
        if r.backend != "embedded" and not r.path:
            raise ConfigError(f"params key models.{role}.path: backend {r.backend} needs a local path or hub id")
        if r.size.text_hidden % r.size.text_heads or r.size.text_heads % r.size.text_kv_heads:
            raise ConfigError(f"params keys models.{role}.size: text_hidden must divide by text_heads, "
                              "and text_heads by text_kv_heads")
    u = p.uplink
    if u.learned is not None and u.bands is not None:
        raise ConfigError(f"params key uplink.bands: {u.bands} pooled bands and a learned encoder exclude each other "
                          "(the encoder sends uplink.learned.rows values per frame); set bands to null")
    if (u.bands is not None or u.merge > 1 or u.normalize != "none" or u.learned or u.bits != 16) \
            and m.cloud.backend != "embedded":
        raise ConfigError(f"params key uplink: a {m.cloud.backend} cloud checkpoint reads the plain log-mel; a coarser "
                          "uplink needs a cloud trained on it (models.cloud.backend embedded), or uplink's defaults")
    if u.bands is not None and u.bands > p.features.n_mels:
        raise ConfigError(f"params key uplink.bands: {u.bands} is more than the features' {p.features.n_mels} mel "
                          "bands (features.n_mels)")
    if p.sweep.batch > 1 and p.decode.cost is None:
        raise ConfigError(f"params key sweep.batch: {p.sweep.batch} captions at once share every forward, so no "
                          "caption's compute can be measured; set decode.cost to a fitted cost model (`speccap "
                          "calibrate` prints one) or sweep.batch to 1")
    if p.sweep.invariant_rows and p.sweep.invariant_rows < p.sweep.batch:
        raise ConfigError(f"params key sweep.invariant_rows: {p.sweep.invariant_rows} rows cannot step a batch of "
                          f"sweep.batch = {p.sweep.batch}; give it at least twice the batch (a loop may hold two "
                          "sessions), or 0 to turn batch-invariant decoding off")
    if p.decode.rule in ("spec_sampling", "qs", "sq") and p.decode.temperature <= 0:
        raise ConfigError(f"params key decode.temperature: {p.decode.rule} needs sampling (temperature > 0)")
    if p.features.n_fft < p.features.hop_length:
        raise ConfigError("params keys features.hop_length / features.n_fft: need hop_length <= n_fft")
    if len(set(p.gates.targets)) != len(p.gates.targets) or not p.gates.targets:
        raise ConfigError(f"params key gates.targets: one or more distinct targets, the main one first; got "
                          f"{list(p.gates.targets)}")
    dk = p.cluster.dask
    if 0 < dk.adapt_maximum < dk.adapt_minimum:
        raise ConfigError("params keys cluster.dask.adapt_minimum <= adapt_maximum (0 = no adaptive scaling)")
    w = p.wisv
    if w.budget_min > w.budget_max:
        raise ConfigError("params keys wisv.budget_min <= wisv.budget_max")
    if w.max_rank == 1:
        raise ConfigError(f"params key wisv.max_rank: 0 (no cap) or >= 2, got {w.max_rank}")
    if not w.verify_ranks or min(w.verify_ranks) < 2 or len(set(w.verify_ranks)) != len(w.verify_ranks):
        raise ConfigError(f"params key wisv.verify_ranks: distinct R >= 2 (R = 1 is greedy), got {list(w.verify_ranks)}")
    if not w.channels:
        raise ConfigError("params key wisv.channels: name at least one channel")


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

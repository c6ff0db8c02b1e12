"""The decode sweep: every configuration (method x language x gate x threshold x L) over the test
split, per-caption records written as they come, resumable, failures kept per configuration.

A configuration's records live in `<runs_dir>/<key>.jsonl`, where the key hashes everything the
records depend on (the configuration, decode and link settings, the models' weights, the clips).
A rerun reads what is there and runs only the captions still missing; a changed model or
setting gets a new key and starts afresh. Captioning fans out over worker processes that load
the models once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import LinkConfig, Params
from ..data.manifest import append_jsonl, read_jsonl
from ..decoding.build import DecodeSpec
from ..decoding.link import Link
from ..decoding.relink import relink
from ..metrics.bootstrap import ClipStats, with_intervals
from ..metrics.caption import score_captions
from ..metrics.system import GPU_FIELDS
from .saved import head_path
from .splits import eval_clips

METHODS = ("edge", "cloud", "ugsd")


@dataclass(frozen=True)
class RunConfig:
    """One configuration of a sweep: a method on one language's clips, over params.link or a named
    channel, and for UGSD the decoder it runs: a `DecodeSpec` the sweep builds once (`ugsd_config`)
    and the worker runs unchanged."""
    method: str
    language: str
    spec: DecodeSpec | None = None  # UGSD's decoder; none for edge-only and cloud-only
    channel: str | None = None  # a named link of wisv.channels instead of params.link

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r} (expected one of {', '.join(METHODS)})")
        if (self.method == "ugsd") != (self.spec is not None):
            raise ValueError(f"{self.method}-{self.language}: UGSD runs a decoder spec; edge- and cloud-only run none")

    @property
    def name(self) -> str:
        if self.spec is None:
            return f"{self.method}-{self.language}"
        d = self.to_dict()
        thr = "" if d["threshold"] is None else f"{d['threshold']:g}"
        length = "Ladapt" if d["block_len"] == 0 else f"L{d['block_len']}"
        level = d.get("level")
        if level == 0:
            length = "Lqsadapt"
        piped = f"-N{d['in_flight']}" if d["in_flight"] else ""
        rule = {"rank": f"rank{d['rank']}", "qs": f"qs{level or ''}", "sq": f"sq{level or ''}"}.get(d["rule"], d["rule"])
        temp = f"-T{d['temperature']:g}" if "temperature" in d else ""
        channel = "" if self.channel is None else f"@{self.channel}"
        if "token" in d:
            length = f"tok{d['token']}"
        first = f"-first{d['corrections']}" if "corrections" in d else ""
        fold = f"-fold{d['fold']}" if "fold" in d else ""
        gate_t = f"@T{d['gate_temperature']:g}" if "gate_temperature" in d else ""
        return f"ugsd-{self.language}-{d['gate']}{thr}{gate_t}-{length}-{rule}{first}{piped}{temp}{channel}{fold}"

    def to_dict(self) -> dict:
        """The configuration as a flat row (results, MLflow params and the key of its records): what
        tells it apart from the others of its sweep; a field that does not apply is left out."""
        row = dict(method=self.method, language=self.language, gate="none", threshold=None, block_len=0, rule="none",
                   rank=0, in_flight=0)
        s = self.spec
        if s is not None:
            row.update(gate=s.gate, threshold=s.threshold, block_len=s.block_len, rule=s.rule,
                       rank=s.rank if s.rule == "rank" else 0, in_flight=s.in_flight)
        level = None if s is None else 0 if s.qs_adaptive else s.qs_level if s.rule in ("qs", "sq") else None
        optional = dict(temperature=s.temperature if s is not None and s.temperature else None, level=level,
                        channel=self.channel, **{k: getattr(s, k, None) for k in ("token", "corrections", "fold",
                                                                                  "gate_temperature")})
        return row | {k: v for k, v in optional.items() if v is not None}

    @property
    def fold(self) -> int | None:
        """Cross-fitting: the fold whose clips it runs on, with the gate that never saw them."""
        return None if self.spec is None else self.spec.fold

    def with_spec(self, **changes) -> RunConfig:
        """This configuration with its decoder changed (`changes`: DecodeSpec fields)."""
        return dataclasses.replace(self, spec=self.spec.replace(**changes))


def ugsd_config(params: Params, language: str, channel: str | None = None, **changes) -> RunConfig:
    """UGSD on `language`: the decoder params describes with `changes` (DecodeSpec fields) on top, in
    the blocking loop unless `in_flight` says otherwise."""
    return RunConfig("ugsd", language, DecodeSpec.from_params(params, **({"in_flight": 0} | changes)), channel)


def default_config(params: Params, lang: str) -> RunConfig:
    """UGSD at decode's gate, threshold, L, rule and loop: the one the quality table compares."""
    d = params.decode
    return ugsd_config(params, lang, **_at_default_gate(params), block_len=d.block_len, in_flight=d.in_flight)


def _at_default_gate(params: Params) -> dict:
    """decode's gate, threshold and rule, as DecodeSpec fields."""
    d = params.decode
    rank = dict(rank=d.rank) if d.rule == "rank" else {}
    return dict(gate=d.gate, threshold=None if d.gate in ("never", "always") else d.threshold, rule=d.rule, **rank)


def build_configs(params: Params) -> list[RunConfig]:
    """Edge-only and cloud-only, the L sweep at the default gate, the gate sweep at the default L
    (all in the default loop, decode.in_flight), and the pipelined loop at the default gate and L."""
    sw, d = params.sweep, params.decode
    configs: list[RunConfig] = []
    for lang in params.data.languages:
        for m in ("edge", "cloud"):
            if m in sw.methods:
                configs.append(RunConfig(m, lang))
        if "ugsd" not in sw.methods:
            continue
        seen = {default_config(params, lang)}
        default_gate = _at_default_gate(params)
        rule = {k: v for k, v in default_gate.items() if k in ("rule", "rank")}
        for length in sw.block_lens:
            seen.add(ugsd_config(params, lang, **default_gate, block_len=length, in_flight=d.in_flight))
        for gate, thresholds in sw.gates.items():
            for thr in thresholds:
                seen.add(ugsd_config(params, lang, gate=gate, threshold=float(thr), **rule, block_len=d.block_len,
                                     in_flight=d.in_flight))
        for n in (0, *sw.in_flight):
            seen.add(ugsd_config(params, lang, **default_gate, block_len=d.block_len, in_flight=n))
        configs += sorted(seen, key=lambda c: (c.spec.gate, c.spec.threshold or 0.0, c.spec.block_len or 99,
                                               c.spec.in_flight))
        if sw.qs_levels:  # every block verified: the rules differ only in what travels and what is accepted
            every = dict(gate="always", threshold=None, block_len=d.block_len or 5, temperature=sw.qs_temperature)
            configs.append(ugsd_config(params, lang, **every, rule="spec_sampling"))
            configs += [ugsd_config(params, lang, **every, rule="qs",
                                    **({"qs_adaptive": True} if lv == 0 else {"qs_level": lv}))
                        for lv in sw.qs_levels]
    return configs


def models_fingerprint(params: Params) -> str:
    """Hash of the weights and tokenizer the records come from (real checkpoints: their path)."""
    h = hashlib.sha256()
    for role in ("edge", "cloud"):
        spec = getattr(params.models, role)
        if spec.backend != "embedded":
            h.update(f"{spec.backend}:{spec.path}".encode())
            continue
        for f in ("model.safetensors", "config.json"):
            p = Path(params.models.dir) / role / f
            h.update(p.read_bytes() if p.exists() else b"missing")
    tok = Path(params.models.dir) / "tokenizer" / "tokenizer.json"
    h.update(tok.read_bytes() if tok.exists() else b"")
    return h.hexdigest()[:12]


def is_headline(cfg: RunConfig, params: Params) -> bool:
    """Edge-only, cloud-only and UGSD at decode's settings: the quality table's three."""
    return cfg.method in ("edge", "cloud") or cfg == default_config(params, cfg.language)


def sweep_clips(params: Params) -> Callable[[RunConfig], list[dict]]:
    """The test clips each decode configuration runs on: all of `sweep.clips` for the headline three,
    the first `sweep.detail_clips` of them for the rest (their intervals are wider, and say so)."""
    clips = {lang: eval_clips(params, lang) for lang in params.data.languages}
    n = params.sweep.detail_clips
    return lambda cfg: clips[cfg.language] if is_headline(cfg, params) or not n else clips[cfg.language][:n]


def link_config(params: Params, cfg: RunConfig):
    """The link a configuration runs on: its named channel of wisv.channels, else params.link."""
    if cfg.channel is None:
        return params.link
    if cfg.channel not in params.wisv.channels:
        raise ValueError(f"{cfg.name}: no channel {cfg.channel!r} in params wisv.channels "
                         f"(have {sorted(params.wisv.channels)})")
    return params.wisv.channels[cfg.channel]


def relinkable(cfg: RunConfig) -> bool:
    """Whether a configuration's captions do not depend on its channel (decoding.relink): a named
    channel, the blocking loop with a fixed window, the greedy or rank rule, a block-level gate."""
    s = cfg.spec
    return (s is not None and cfg.channel is not None and s.rule in ("greedy", "rank") and s.block_len > 0
            and s.in_flight == 0 and not s.qs_adaptive and s.token is None and s.corrections is None)


def relink_source(cfg: RunConfig, params: Params) -> RunConfig | None:
    """The configuration whose records `cfg` relinks instead of decoding: the same one on the first
    channel of wisv.channels (None for that one, and for what cannot be relinked)."""
    first = next(iter(params.wisv.channels), None)
    if not relinkable(cfg) or cfg.channel == first:
        return None
    return dataclasses.replace(cfg, channel=first)


def wisv_fingerprint(params: Params) -> str:
    """Hash of the trained WISV head (its records change with it)."""
    p = head_path(params)
    return hashlib.sha256(p.read_bytes() if p.exists() else b"missing").hexdigest()[:12]


def stepping_key(params: Params) -> list:
    """What a record depends on in how its caption was stepped: batch-invariant stepping's rows, when
    set (empty when not, so the keys from before it stay)."""
    return [("invariant_rows", params.sweep.invariant_rows)] if params.sweep.invariant_rows else []


def config_key(cfg: RunConfig, params: Params, models_fp: str, clip_ids: list[str]) -> str:
    decode = dataclasses.asdict(params.decode)
    if cfg.method in ("edge", "cloud"):  # no gate, L, rule or loop: their records survive a change of those
        # (but not of the clock's charge; only a set one is keyed, so the keys from before it stay)
        clocks = ("temperature", "edge_time_scale", "cloud_time_scale") + (("cost",) if decode["cost"] else ())
        decode = {k: decode[k] for k in clocks}
    items = [cfg.to_dict(), decode, dataclasses.asdict(link_config(params, cfg)),
             params.models.max_new_tokens, params.seed, models_fp, clip_ids]
    if cfg.spec is not None and cfg.spec.rule == "wisv":  # appended only here, so the keys of every other configuration stay as they were
        items += [params.wisv.protocol, params.wisv.tau, wisv_fingerprint(params)]
        if params.wisv.max_rank:  # added later: keys without a cap stay as they were
            items.append(("max_rank", params.wisv.max_rank))
    if relinkable(cfg):  # its records carry link_log (older ones did not)
        items.append("link_log")
    items += stepping_key(params)
    blob = json.dumps(items, sort_keys=True, default=str)
    return f"{cfg.name}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def run_config(cfg: RunConfig, clips: list[dict], pool, path: Path, progress=None,
               relink_from: tuple[Path, LinkConfig, int] | None = None) -> list[dict]:
    """Caption every clip not yet in `path` (appending each record as it comes); return all records.
    `relink_from` (records file, link, seed): relink that file's records onto the link instead of decoding."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()] if path.exists() else []
    have = {r["id"]: r for r in (read_jsonl(path, tolerate_partial_last_line=True) if lines else [])
            if "error" not in r}
    if len(have) != len(lines):  # drop error records and a torn last line: they are retried
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in have.values()), encoding="utf-8")
        os.replace(tmp, path)
    todo = [(cfg, c["id"]) for c in clips if c["id"] not in have]
    made = pool.imap(todo) if relink_from is None else relinked(cfg, [job[1] for job in todo], *relink_from)
    for rec in made:
        append_jsonl(path, rec)
        have[rec["id"]] = rec
        if progress is not None:
            progress()
    settle_log(path, [c["id"] for c in clips])
    return [have[c["id"]] for c in clips]


def settle_log(path: Path, ids: list[str], keep: Callable[[dict], bool] | None = None) -> None:
    """Leave a record log appended as results arrived holding the records of `ids` alone (those
    `keep` accepts), in the order of `ids`, each line's bytes kept: workers finish in an order the
    machine's load decides, and what an earlier run left for other clips or settings is no result of
    this one; a stage's outputs must depend on neither. Untouched when already so."""
    if not path.exists():
        return
    lines = [x for x in path.read_text(encoding="utf-8").splitlines(keepends=True) if x.strip()]
    rank = {clip_id: i for i, clip_id in enumerate(ids)}
    records = [(line, json.loads(line)) for line in lines]
    kept = [(rank[r.get("id")], line) for line, r in records if r.get("id") in rank and (keep is None or keep(r))]
    ordered = [line for _, line in sorted(kept, key=lambda x: x[0])]  # stable: a clip's lines stay in order
    if ordered != lines:
        tmp = path.with_name(path.name + ".part")
        tmp.write_text("".join(x if x.endswith("\n") else x + "\n" for x in ordered), encoding="utf-8")
        os.replace(tmp, path)


def prune_logs(folder: Path, keep: set[str]) -> None:
    """Delete the record logs (*.jsonl) in `folder` not named in `keep`: an earlier run's, for
    configurations or settings this run no longer has (their keys differ), are no output of it."""
    for path in Path(folder).glob("*.jsonl"):
        if path.name not in keep:
            path.unlink()


def relinked(cfg: RunConfig, clip_ids: list[str], source: Path, link: LinkConfig, seed: int):
    """`cfg`'s records of `clip_ids` from the source configuration's records file, each relinked
    onto `link` (a fresh link model per caption with the decode's seed, as caption_one makes)."""
    if not clip_ids:
        return
    have = {r["id"]: r for r in read_jsonl(source)} if source.exists() else {}
    missing = [c for c in clip_ids if c not in have or "error" in have[c]]
    if missing:
        raise RuntimeError(f"{cfg.name}: relinks {source}, which lacks {len(missing)} of its captions "
                           f"(first: {missing[0]}); run that configuration first")
    for clip_id in clip_ids:
        yield relink(have[clip_id], Link(link, seed=seed)) | {
            "relinked_from": source.stem}


def summarize(cfg: RunConfig, records: list[dict], clips: list[dict]) -> dict:
    """Quality against the references and the mean system metrics of one configuration."""
    errors = [r for r in records if "error" in r]
    if errors:
        raise RuntimeError(f"{cfg.name}: {len(errors)} of {len(records)} captions failed; first: {errors[0]['error']}")
    s = score_captions([r["caption"] for r in records], [c["references"] for c in clips], cfg.language,
                       [c.get("emotion") for c in clips])
    out = {k: v for k, v in s.summary().items() if isinstance(v, (int, float)) and v is not None}
    # 95% paired-bootstrap intervals over the clips, and the per-clip numbers that pair methods later
    stats = ClipStats.from_records([c["id"] for c in clips], s.per_caption)
    out = with_intervals(out, stats)
    out["clip_stats"] = stats.to_json()
    keys = ("ttft", "itps", "oet", "otps", "total_time", "edge_compute", "cloud_compute", "link_time", "tokens",
            "rounds", "drafted", "transmitted", "accepted", "corrected", "bonus", "tolerated", "hidden_requests",
            "bytes_up", "bytes_down",
            "cpu_percent", "ram_gb", *GPU_FIELDS, *(f"batch_{k}" for k in GPU_FIELDS), "wall_time", "model_time", "cloud_tokens",
            "edge_fed", "wait_time", "wasted", "stale")
    for k in keys:
        vals = [r[k] for r in records if k in r]
        if vals:
            out[k] = statistics.fmean(vals)
    drafted = sum(r.get("drafted", 0) for r in records)
    rounds = sum(r.get("rounds", 0) for r in records)
    out["rho"] = sum(r.get("transmitted", 0) for r in records) / drafted if drafted else 0.0
    out["aal"] = sum(r.get("accepted", 0) for r in records) / rounds if rounds else 0.0
    checked, accepted = [], []
    for r in records:
        for i, (c, a) in enumerate(zip(r.get("position_checked", []), r.get("position_accepted", []))):
            if i >= len(checked):
                checked.append(0)
                accepted.append(0)
            checked[i] += c
            accepted[i] += a
    out["position_acceptance"] = [a / c if c else 0.0 for a, c in zip(accepted, checked)]
    return out

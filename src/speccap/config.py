"""Typed view of params.yaml: the one place that reads the file.

Every stage, flow and command gets its knobs from `load_params()`. Unknown keys and wrong
types fail at load time with the dotted key path, so a typo in params.yaml never silently
falls back to a default. A `profile` key selects a block under `profiles:` whose keys are
merged over the top-level ones (the CI profile is the same pipeline with smaller sizes).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import field
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import ConfigDict, Strict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as _pydantic_dataclass

PARAMS_ENV = "SPECCAP_PARAMS"


class ConfigError(ValueError):
    """params.yaml is missing, malformed, or names an unknown / mistyped key."""


# The schema: frozen dataclasses validated by pydantic, unknown keys refused. Numbers and flags are
# strict (a YAML `true` is not a 1, "1.5" is not a number); an int is a float where one is wanted.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Language = Literal["en", "zh"]
Backend = Literal["embedded", "qwen2_5_omni", "qwen3_omni_moe"]
Family = Literal["qwen2_5_omni", "qwen3_omni_moe"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
# params decode.rule and decode.gate; decoding.rules and decoding.gates build them
RuleName = Literal["greedy", "rank", "spec_sampling", "qs", "sq"]
GateName = Literal["never", "always", "entropy", "margin", "logprob"]
ScoreGate = Literal["entropy", "margin", "logprob"]  # the gates that score a block against a threshold
Method = Literal["edge", "cloud", "ugsd"]
GateKind = Literal["logistic", "lightgbm", "mlp"]  # classifiers of the learned token gates
GateTarget = Literal["gain", "mismatch", "critical"]
VerifyName = Literal["alone", "pending"]  # what goes up with a token a token-level gate flags
params_class = _pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))


@params_class
class SyntheticParams:
    # Clips per spoken language in each split; the test split mirrors the papers' 332 per language.
    train_per_language: Int = 1000
    val_per_language: Int = 150
    test_per_language: Int = 332
    references_per_clip: Int = 3
    workers: Int = 2
    # Each emotion's pitch, range, rate and volume are drawn around its profile with the profile's
    # spread times this: below 1 the emotions overlap less, so hearing them is easier (the cue
    # combinations that tell them apart stay the same).
    cue_spread: Float = 1.0


@params_class
class Mer2024Params:
    # Local copy of the MER2024 caption subset (EULA: never downloaded by this code).
    path: str | None = None
    reference_mode: Literal["audio_only", "full"] = "audio_only"  # full | audio_only


@params_class
class TracePoolParams:
    # Unlabeled speech the gates and the WISV head learn from when the corpus has no referenced train
    # and validation clips (MER2024): any folder of audio, split train/validation by a hash of each
    # file's name; the cloud-only caption is its reference (data.trace_references).
    path: str | None = None
    val_share: Float = 0.2


@params_class
class CrossFitParams:
    # Gates and the WISV head learned on the referenced clips themselves, k folds: each fold's gates
    # trained on k - 2 folds, thresholded on the next fold, evaluated on their own fold only.
    # auto = when the corpus has no train clips of its own (MER2024 without a trace pool).
    when: Literal["always", "auto", "never"] = "auto"  # auto | always | never
    folds: Int = 5


@params_class
class DataParams:
    source: Literal["mer2024", "synthetic"] = "synthetic"  # synthetic | mer2024
    languages: tuple[Language, ...] = ("en", "zh")
    max_clip_seconds: Float = 30.0
    raw_dir: str = "data/raw"
    processed_dir: str = "data/processed"
    synthetic: SyntheticParams = field(default_factory=SyntheticParams)
    mer2024: Mer2024Params = field(default_factory=Mer2024Params)
    trace_pool: TracePoolParams = field(default_factory=TracePoolParams)
    # What the train and validation clips' corrections are judged against (the trace_refs stage):
    # auto = a clip's human references, or the cloud-only caption where it has none (a trace pool);
    # cloud = the cloud-only caption for every clip (how much that loses: benchmarks/cloud_labels.py)
    trace_references: Literal["auto", "cloud"] = "auto"
    cross_fit: CrossFitParams = field(default_factory=CrossFitParams)


@params_class
class FeatureParams:
    sample_rate: Int = 16000
    n_mels: Int = 128
    n_fft: Int = 400
    # Qwen-Omni processors use hop 160 (10 ms); the embedded captioners train twice as fast on 320.
    hop_length: Int = 160
    workers: Int = 2


@params_class
class ThinkerSize:
    """Size of an embedded captioner (a small config of a Qwen-Omni thinker class)."""

    text_hidden: Int = 128
    text_layers: Int = 2
    text_heads: Int = 4
    text_kv_heads: Int = 2
    text_ffn: Int = 256
    audio_d: Int = 128
    audio_layers: Int = 2
    audio_heads: Int = 4
    audio_ffn: Int = 256
    # Qwen3-Omni-MoE only
    experts: Int = 4
    experts_per_token: Int = 2


@params_class
class TrainParams:
    max_steps: Int = 600
    batch_size: Int = 32
    lr: Float = 2e-3
    warmup_steps: Int = 50
    weight_decay: Float = 0.01
    eval_every: Int = 50
    patience: Int = 4  # evaluations without a better validation loss before stopping
    threads: Int = 2
    # weight of an auxiliary emotion loss during training only: a linear probe on the audio positions
    # of the text model's input, discarded afterwards (0 = captions alone)
    emotion_aux: Float = 0.0
    # likewise for which of the synthetic corpus's sentences is said (a clip of another corpus has none
    # and is skipped): as if the model had heard far more speech, it learns to tell the words apart
    sentence_aux: Float = 0.0
    # likewise for the values a synthetic clip's cues were rendered with (pitch, range, rate, volume,
    # contour, effects): dense where the captions name them in words, in bins and only now and then
    cues_aux: Float = 0.0


@params_class
class ModelParams:
    # embedded: a captioner trained here; qwen2_5_omni / qwen3_omni_moe: a real checkpoint at `path`
    backend: Backend = "embedded"
    family: Family = "qwen2_5_omni"  # thinker class of an embedded captioner
    path: str | None = None  # local path or hub id of a real checkpoint
    dtype: DType = "auto"  # auto: bf16 on GPU, fp32 on CPU
    size: ThinkerSize = field(default_factory=ThinkerSize)
    train: TrainParams = field(default_factory=TrainParams)


@params_class
class ModelsParams:
    dir: str = "models"
    tokenizer_vocab: Int = 1000
    max_new_tokens: Int = 128
    edge: ModelParams = field(default_factory=ModelParams)
    cloud: ModelParams = field(default_factory=ModelParams)


@params_class
class AdaptiveParams:
    l_min: Int = 3
    l_base: Int = 5
    l_max: Int = 7


@params_class
class DecodeParams:
    temperature: Float = 0.0  # 0 = greedy drafting and generation
    rule: Literal["greedy", "qs", "rank", "spec_sampling", "sq"] = "rank"  # greedy | rank | spec_sampling
    # R of the rank rule. The papers' R = 20 is for Qwen's 152k vocabulary; with the embedded
    # ~1k vocabulary a draft token's cloud rank is almost never above 20, so R is 1-3 here.
    rank: Int = 2
    gate: GateName = "entropy"  # never | always | entropy | margin | logprob
    threshold: Float = 1.0
    block_len: Int = 5  # fixed draft length L; 0 = the UGSD adaptive rule below
    adaptive: AdaptiveParams = field(default_factory=AdaptiveParams)
    # pipelined verification: escalated blocks in flight while the edge drafts ahead; 0 = the
    # blocking loop of the papers (the edge waits for every verdict)
    in_flight: Int = 0
    draft_ahead: Literal["adaptive", "always"] = "adaptive"  # adaptive | always (see decoding/pipelined.py)
    # hardware emulation on the virtual clock: measured compute times these (e.g. an edge 400x
    # slower than this CPU runs the embedded edge at the papers' ~2 tokens/s)
    edge_time_scale: Float = 1.0
    cloud_time_scale: Float = 1.0


@params_class
class MarkovParams:
    good_mbps: Float = 4.0
    bad_mbps: Float = 0.35
    p_good_to_bad: Float = 0.1
    p_bad_to_good: Float = 0.3


@params_class
class LinkConfig:
    name: str = "wifi"
    uplink_mbps: Float = 20.0
    downlink_mbps: Float = 100.0
    rtt_ms: Float = 50.0
    packet_error_rate: Float = 0.0
    overhead_bytes: Int = 40
    markov: MarkovParams | None = None  # set: a two-state good/bad channel replaces the fixed rates


@params_class
class TraceParams:
    train_clips: Int = 150  # clips per language of the train split traced (0 = all)
    val_clips: Int = 50  # of the validation split (thresholds and promotion are chosen on these)
    block_len: Int = 5  # the block gates' L (the block-level entropy baseline of the gate evaluation)
    # quality points a correction must gain to make a mismatch critical: token gates' on-policy
    # traces, mean of BLEU-1/METEOR/ROUGE-L/100 x emotion hit; WISV's traces, mean of the first three
    critical_margin: Float = 1.0


@params_class
class DaggerParams:
    # DAgger: after the first gates, trace the captions the loop commits under the chosen gate (the
    # critical target's, at the promote budget), add them to the training traces and train again;
    # the thresholds come from the last round's validation traces (where the deployed gate goes)
    rounds: Int = 0
    train_clips: Int = 200  # train clips per language traced each round (0 = all)
    val_clips: Int = 0  # validation clips per language (0 = those of gates.traces)


@params_class
class GatesParams:
    traces: TraceParams = field(default_factory=TraceParams)
    dagger: DaggerParams = field(default_factory=DaggerParams)
    # token gates (gating.token_gates): classifiers x targets, trained on the on-policy traces
    kinds: tuple[GateKind, ...] = ("logistic", "lightgbm", "mlp")
    targets: tuple[GateTarget, ...] = ("critical", "mismatch")
    # the critical target's row weights: a critical token weighs 1 + impact_weight x its impact (0 = all 1)
    impact_weight: Float = 0.0
    verify: VerifyName = "alone"  # what goes up with a flagged token (decoding.gates)
    # R of the rank rule a flagged token may be judged by besides decode.rank's; chosen per language on
    # validation (pipeline.verify_rank); () = decode's rule only
    verify_ranks: tuple[Int, ...] = ()
    baselines: tuple[ScoreGate, ...] = ("entropy",)  # rule gates evaluated at the same budgets, per token and per block
    budgets: tuple[Float, ...] = (0.05, 0.1)  # target escalation rates rho*
    # the oracle at a budget: every token judged, the first k the cloud replaces replaced, one row per
    # k (decoding.verify.Rank.max_corrections); () = only the unlimited oracle
    oracle_corrections: tuple[Int, ...] = ()
    eval_clips: Int = 0  # test clips per language for the gate evaluation (0 = all)
    # the oracle, the per-token baselines and the critical-target gates run on all `eval_clips`; the
    # per-block baselines, the other targets and the other verification variant on the first
    # `detail_clips` of them (0 = the same)
    detail_clips: Int = 0
    registry_name: str = "speccap-gate"
    promote_budget: Float = 0.1  # the budget the champion is chosen at (quality on validation)
    promote_clips: Int = 50  # validation clips per language the candidates are decoded on (0 = all traced)


@params_class
class SweepParams:
    methods: tuple[Method, ...] = ("edge", "cloud", "ugsd")
    block_lens: tuple[Int, ...] = (3, 5, 7, 10, 20, 50, 0)  # at decode.gate / decode.threshold; 0 = adaptive
    gates: dict[ScoreGate, tuple[Float, ...]] = field(  # at decode.block_len
        default_factory=lambda: {"entropy": (0.5, 1.0, 2.0), "margin": (0.1, 0.3, 0.5)})
    in_flight: tuple[Int, ...] = ()  # pipelined runs at the default gate and L (blocks in flight, >= 1)
    clips: Int = 0  # test clips per language; 0 = the whole test split
    # the headline configurations (edge-only, cloud-only, UGSD at decode's settings) run on `clips`;
    # the others (L, gate, pipelined and Q-S sweeps) on the first `detail_clips` of them (0 = the same)
    detail_clips: Int = 0
    workers: Int = 2  # processes, each with the models loaded once
    threads: Int = 1  # torch threads per worker
    runs_dir: str = "reports/runs"
    # Q-S next to speculative sampling, every block verified, at this temperature: one configuration
    # per lattice level (0 = the adaptive policy choosing L and level per round) plus the dense baseline
    qs_levels: tuple[Int, ...] = ()
    qs_temperature: Float = 1.0


@params_class
class QSParams:
    # Q-S (decode.rule qs, or sq: the biased sample-then-quantize order): the edge's draft
    # distribution on the lattice {b / level : sum b = level}, sent sparsely
    level: Int = 16
    levels: tuple[Int, ...] = (2, 4, 8, 16, 32, 64)  # what the adaptive policy (L and level per round) picks from
    l_max: Int = 8  # the longest draft the adaptive policy plans


@params_class
class WisvTraceParams:
    train_clips: Int = 100  # clips per language traced for the head (0 = all)
    val_clips: Int = 30
    block_len: Int = 5
    critical_margin: Float = 1.0  # as gates.traces: quality points a kept draft token must cost


def _wisv_channels() -> dict:
    """The evaluation's channels: 20 / 500 Mbps uplink x 5 / 50 ms RTT, and the two-state Markov one."""
    out = {f"up{up}-rtt{rtt}": LinkConfig(f"up{up}-rtt{rtt}", float(up), float(down), float(rtt))
           for up, down in ((20, 100), (500, 1000)) for rtt in (5, 50)}
    out["markov"] = LinkConfig("markov", 4.0, 4.0, 20.0, markov=MarkovParams())
    return out


@params_class
class WisvParams:
    # CSI-aware acceptance (decoding/wisv.py, gating/wisv.py): traces with hidden states -> relabeled
    # critical mismatches under drawn channels -> the decision head -> evaluation over channels
    traces: WisvTraceParams = field(default_factory=WisvTraceParams)
    kappa: Float = 0.5  # smoothed importance: weight kappa^|m - m'| of a neighbouring critical mismatch
    policy_temperature: Float = 0.1  # T of P(repair) = sigmoid((s - lambda) / T)
    budget_min: Float = 0.2  # share of critical mismatches repaired on the worst channel ...
    budget_max: Float = 1.0  # ... and on the best
    csi_draws: Int = 4  # channels drawn per traced caption
    hidden: Int = 64  # head width
    dropout: Float = 0.1
    epochs: Int = 300  # at most: early stopping on held-out captions ends it sooner (patience)
    lr: Float = 0.01
    # where the judged mismatches come from: shadow = the traces stage's on-policy traces (shared with
    # the token gates); own = greedy-verified traces of its own (wisv.traces)
    labels: Literal["own", "shadow"] = "shadow"
    rank: Int = 8  # each hidden state through a learned projection to this many dims (0 = raw concatenation)
    scalars: Bool = True  # the head also reads the cloud's scalars about the token (gating.wisv.CLOUD_SCALARS)
    weight_decay: Float = 0.01
    patience: Int = 30  # epochs without a better held-out loss before training stops (0 = no early stopping)
    # > 0: a factored head (gating.wisv.DecisionHead): a criticality score of the token that also learns
    # the raw critical flags (this weight on that loss) plus a linear channel term; 0 = one network
    # that reads the CSI beside the token and learns the relabeled target only
    critical_weight: Float = 1.0
    tau: Float = 0.5  # tolerate a mismatch when P(reject) < tau
    max_rank: Int = 0  # and only when the draft token is in the cloud's top max_rank (0 = no cap)
    protocol: Literal["auto", "full", "selective"] = "auto"  # full | selective | auto (per round, on the link model)
    registry_name: str = "speccap-wisv-head"
    block_lens: tuple[Int, ...] = (4, 8)  # draft windows of the evaluation
    # rank-R rules of the evaluation (R = 1 is greedy): the frontier WISV is compared with at its AAL
    verify_ranks: tuple[Int, ...] = (2, 3)
    eval_clips: Int = 50  # test clips per language (0 = all)
    channels: dict[str, LinkConfig] = field(default_factory=_wisv_channels)


@params_class
class TrackingParams:
    # sqlite:///mlflow.db = a SQLite store at the project root (one store for every DVC experiment
    # copy); any MLflow URI works (http://host:5000); $MLFLOW_TRACKING_URI wins over this.
    uri: str = "sqlite:///mlflow.db"
    experiment: str = "speccap"
    # a shared Prefect server (http://host:4200/api); "" = one started per `dvc repro`
    # (scripts/with_prefect.sh); $PREFECT_API_URL wins over this
    prefect_api_url: str = ""


@params_class
class DaskParams:
    kind: Literal["local", "slurm"] = "local"  # local: a LocalCluster on this machine; slurm: dask-jobqueue SLURMCluster jobs
    workers: Int = 2  # LocalCluster workers, or Slurm jobs to start with (one worker each)
    threads_per_worker: Int = 1  # one task at a time per worker: each holds its own models
    adapt_maximum: Int = 0  # > 0: scale between adapt_minimum and this many workers with the load
    adapt_minimum: Int = 0


@params_class
class SlurmParams:
    queue: str = ""  # partition (#SBATCH -p)
    account: str = ""  # #SBATCH -A
    cores: Int = 8  # CPU cores per job
    memory: str = "64GB"
    walltime: str = "04:00:00"
    gpus: Int = 1  # #SBATCH --gres=gpu:N
    job_extra_directives: tuple[str, ...] = ()  # more #SBATCH lines, e.g. "--constraint=a100"
    job_script_prologue: tuple[str, ...] = ()  # shell lines before the worker starts (module load, venv)
    local_directory: str = "/tmp"  # worker scratch space on the node
    log_directory: str = "logs/slurm"


@params_class
class ClusterParams:
    # local: each sweep configuration in turn, its captions over sweep.workers processes here;
    # dask: configurations as Prefect tasks on a Dask cluster (each worker keeps its models loaded)
    executor: Literal["dask", "local"] = "local"
    dask: DaskParams = field(default_factory=DaskParams)
    slurm: SlurmParams = field(default_factory=SlurmParams)


@params_class
class Params:
    seed: Int = 0
    profile: str = "default"
    data: DataParams = field(default_factory=DataParams)
    features: FeatureParams = field(default_factory=FeatureParams)
    models: ModelsParams = field(default_factory=ModelsParams)
    decode: DecodeParams = field(default_factory=DecodeParams)
    link: LinkConfig = field(default_factory=LinkConfig)
    sweep: SweepParams = field(default_factory=SweepParams)
    gates: GatesParams = field(default_factory=GatesParams)
    tracking: TrackingParams = field(default_factory=TrackingParams)
    qs: QSParams = field(default_factory=QSParams)
    wisv: WisvParams = field(default_factory=WisvParams)
    cluster: ClusterParams = field(default_factory=ClusterParams)


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


# ---- what each DVC stage depends on, resolved ----
# DVC tracks params by their keys in params.yaml, so a stage listing `profiles` would re-run when
# ANY profile changes, and one not listing it would miss its own profile's overrides. Instead the
# `resolve` stage writes, per stage, the values it really uses after the profile is applied
# (resolved/<stage>.json); the stage depends on that file, which only changes when they do.
_GATE_DECODE = ("decode.temperature", "decode.rule", "decode.rank", "decode.in_flight", "decode.draft_ahead",
                "decode.edge_time_scale", "decode.cloud_time_scale")
# whether the gates learn from folds of the test clips (pipeline.folds.active), and how many
_CROSS_FIT = ("data.source", "data.trace_pool.path", "data.cross_fit")
STAGE_PARAMS: dict[str, tuple[str, ...]] = {
    "prepare": ("seed", "data"),
    "featurize": ("features", "data.max_clip_seconds"),
    "train": ("seed", "models", "features", "data.languages"),
    "decode": ("seed", "decode", "link", "sweep", "qs", "models.max_new_tokens", "data.languages",
               "tracking.experiment"),
    "report": ("decode", "link", "data.languages"),
    "trace_refs": ("seed", "data.trace_references", *_CROSS_FIT, "decode.temperature", "decode.cloud_time_scale",
                   "models.max_new_tokens", "data.languages", "sweep.workers", "sweep.threads"),
    "traces": ("seed", "data.trace_references", "gates.traces", "decode.rank", "models.max_new_tokens", "data.languages"),
    # the link changes when the DAgger and verify-rank captions' clocks tick, not what they say: not listed
    "gates": ("seed", "gates.kinds", "gates.targets", "gates.impact_weight", "gates.baselines", "gates.budgets", "gates.registry_name",
              "gates.verify", "gates.verify_ranks", "gates.promote_budget", "gates.traces", "gates.dagger",
              *_GATE_DECODE, "sweep.workers", "sweep.threads", "models.max_new_tokens", "data.languages",
              *_CROSS_FIT, "tracking.experiment"),
    # gates are evaluated at the block length their thresholds were calibrated on (gates.traces.block_len),
    # so a change of decode.block_len leaves them alone
    "gate_eval": ("seed", "gates", *_GATE_DECODE, *_CROSS_FIT, "link", "sweep.workers", "sweep.threads", "models.max_new_tokens",
                  "data.languages", "tracking.experiment"),
    "promote": ("seed", "gates", *_GATE_DECODE, "link", "sweep.workers", "sweep.threads", "models.max_new_tokens",
                "data.languages", "tracking.experiment"),
    "wisv_head": ("seed", "wisv.traces", "wisv.kappa", "wisv.policy_temperature", "wisv.budget_min",
                  "wisv.budget_max", "wisv.csi_draws", "wisv.hidden", "wisv.dropout", "wisv.epochs", "wisv.lr",
                  "wisv.rank", "wisv.scalars", "wisv.weight_decay", "wisv.patience", "wisv.labels",
                  "gates.traces",
                  "wisv.registry_name", "models.max_new_tokens", "data.languages", "tracking.experiment"),
    # its edge-only, cloud-only and greedy runs read decode's temperature and clocks, and the link
    "wisv_eval": ("seed", "wisv", "decode.rank", "decode.temperature", "decode.edge_time_scale",
                  "decode.cloud_time_scale", "link", *_CROSS_FIT, "sweep.workers", "sweep.threads", "models.max_new_tokens",
                  "data.languages", "tracking.experiment"),
}


def stage_params(p: Params, stage: str) -> dict:
    """The resolved values of the keys `stage` depends on, as plain data (dotted key -> value)."""
    if stage not in STAGE_PARAMS:
        raise ConfigError(f"unknown stage {stage!r} (have {sorted(STAGE_PARAMS)})")
    out = {}
    for key in STAGE_PARAMS[stage]:
        value = p
        for part in key.split("."):
            value = getattr(value, part)
        out[key] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def write_resolved(p: Params, out_dir: str | os.PathLike) -> list[Path]:
    """Write resolved/<stage>.json for every stage; a file is rewritten only if its content changes."""
    import json
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stage in STAGE_PARAMS:
        path = out / f"{stage}.json"
        text = json.dumps(stage_params(p, stage), indent=1, sort_keys=True, default=list) + "\n"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    return written


def gate_decode(p: Params) -> DecodeParams:
    """The decode settings gates are evaluated and promoted at: params.decode with the block length
    the traces (and so the thresholds) were made with."""
    return dataclasses.replace(p.decode, block_len=p.gates.traces.block_len)

"""The params schema: what params.yaml may hold, its types, allowed names and defaults.

Frozen dataclasses validated by pydantic (speccap.config reads the file into them): unknown keys
are refused, numbers and flags are strict (a YAML `true` is not a 1, "1.5" is not a number), an int
is a float where one is wanted. The value types and every list of allowed names: params_types.py;
the `cluster:` section: params_cluster.py. Cross-field rules: config._validate.
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from pydantic import Field, Strict

from .params_cluster import ClusterParams
from .params_types import (
    Backend,
    Bool,
    Count,
    DType,
    Family,
    Float,
    GateKind,
    GateName,
    GateTarget,
    Int,
    Language,
    Method,
    NonNeg,
    NonNegFloat,
    Positive,
    RuleName,
    ScoreGate,
    Share,
    Unit,
    VerifyName,
    params_class,
)
from .params_uplink import PrivacyParams, UplinkParams


@params_class
class SyntheticParams:
    # Clips per spoken language in each split; the test split mirrors the papers' 332 per language.
    train_per_language: Count = 1000
    val_per_language: Count = 150
    test_per_language: Count = 332
    references_per_clip: Count = 3
    workers: Count = 2
    # Each emotion's pitch, range, rate and volume are drawn around its profile with the profile's spread
    # times this: below 1 the emotions overlap less (the cue combinations that tell them apart stay).
    cue_spread: Annotated[float, Strict(), Field(gt=0, le=2)] = 1.0


@params_class
class Mer2024Params:
    # Local copy of the MER2024 caption subset (EULA: never downloaded by this code).
    path: str | None = None
    reference_mode: Literal["audio_only", "full"] = "audio_only"


@params_class
class TracePoolParams:
    # Unlabeled speech the gates and the WISV head learn from when the corpus has no referenced train
    # and validation clips (MER2024): any folder of audio, split train/validation by a hash of each
    # file's name; the cloud-only caption is its reference (data.trace_references).
    path: str | None = None
    val_share: Annotated[float, Strict(), Field(gt=0, lt=1)] = 0.2


@params_class
class CrossFitParams:
    # Gates and the WISV head learned on the referenced clips themselves, k folds: each fold's gates
    # trained on k - 2 folds, thresholded on the next fold, evaluated on their own fold only.
    # auto = when the corpus has no train clips of its own (MER2024 without a trace pool).
    when: Literal["always", "auto", "never"] = "auto"
    folds: Annotated[int, Strict(), Field(ge=3)] = 5  # a fold to test, one to threshold on, one or more to train on


@params_class
class DataParams:
    source: Literal["mer2024", "synthetic"] = "synthetic"
    languages: Annotated[tuple[Language, ...], Field(min_length=1)] = ("en", "zh")
    max_clip_seconds: Positive = 30.0
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
    hop_length: Count = 160
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
    experts: Int = 4  # Qwen3-Omni-MoE only
    experts_per_token: Int = 2  # Qwen3-Omni-MoE only


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
class RoleCost:
    prefill: tuple[NonNegFloat, NonNegFloat]  # seconds = a + b * audio frames
    extend: tuple[NonNegFloat, NonNegFloat, NonNegFloat]  # a + b * new + c * new * (cached + new)


@params_class
class CostParams:
    edge: RoleCost
    cloud: RoleCost


@params_class
class DecodeParams:
    temperature: Float = 0.0  # 0 = greedy drafting and generation
    rule: RuleName = "rank"
    # R of the rank rule (the papers' 20 is for Qwen's 152k vocabulary; 1-3 for the embedded ~1k one)
    rank: Count = 2
    gate: GateName = "entropy"  # never | always | entropy | margin | logprob
    threshold: Float = 1.0
    block_len: NonNeg = 5  # fixed draft length L; 0 = the UGSD adaptive rule below
    adaptive: AdaptiveParams = field(default_factory=AdaptiveParams)
    # pipelined verification: escalated blocks in flight while the edge drafts ahead; 0 = the
    # blocking loop of the papers (the edge waits for every verdict)
    in_flight: NonNeg = 0
    draft_ahead: Literal["adaptive", "always"] = "adaptive"  # see decoding/pipelined.py
    # hardware emulation on the virtual clock: measured compute times these (e.g. an edge 400x
    # slower than this CPU runs the embedded edge at the papers' ~2 tokens/s)
    edge_time_scale: Positive = 1.0
    cloud_time_scale: Positive = 1.0
    # the clock: null = each model call charged its measured compute (moves with the machine's load);
    # a fitted cost model (decoding.cost; `speccap calibrate` prints one) = the same charge on any load
    cost: CostParams | None = None


@params_class
class MarkovParams:
    good_mbps: Float = 4.0
    bad_mbps: Float = 0.35
    p_good_to_bad: Float = 0.1
    p_bad_to_good: Float = 0.3


@params_class
class LinkConfig:
    name: str = "wifi"
    uplink_mbps: Positive = 20.0
    downlink_mbps: Positive = 100.0
    rtt_ms: NonNegFloat = 50.0
    packet_error_rate: Annotated[float, Strict(), Field(ge=0, lt=1)] = 0.0
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
class CeilingParams:
    # the ceiling at a budget (pipeline.ceiling): the best captions a greedy search over which of the
    # cloud's corrections to send finds, with the cloud's answers known, at each of these budgets
    budgets: tuple[Share, ...] = (0.03, 0.05, 0.07, 0.1, 0.2)
    steps: Count = 8  # corrections the search adds to a caption, at most
    clips: Int = 0  # the first this many gate-evaluation clips per language (0 = all of them)


@params_class
class GatesParams:
    traces: TraceParams = field(default_factory=TraceParams)
    dagger: DaggerParams = field(default_factory=DaggerParams)
    ceiling: CeilingParams = field(default_factory=CeilingParams)
    # token gates (gating.token_gates): classifiers x targets, trained on the on-policy traces
    kinds: tuple[GateKind, ...] = ("logistic", "lightgbm", "mlp")
    targets: tuple[GateTarget, ...] = ("critical", "mismatch")
    impact_weight: NonNegFloat = 0.0  # the critical target's row weights: 1 + impact_weight x impact (0 = all 1)
    verify: VerifyName = "alone"  # what goes up with a flagged token (decoding.gates)
    # R of the rank rule a flagged token may be judged by besides decode.rank's; chosen per language on
    # validation (pipeline.verify_rank); () = decode's rule only
    verify_ranks: tuple[Count, ...] = ()
    baselines: tuple[ScoreGate, ...] = ("entropy",)  # rule gates evaluated at the same budgets, per token and per block
    # the per-token entropy baseline's temperatures: one chosen per budget and language on validation (pipeline.gates)
    entropy_temperatures: Annotated[tuple[Positive, ...], Field(min_length=1)] = (1.0,)
    budgets: Annotated[tuple[Share, ...], Field(min_length=1)] = (0.05, 0.1)  # target escalation rates rho*
    # the oracle at a budget: every token judged, the first k the cloud replaces replaced, one row per
    # k (decoding.verify.Rank.max_corrections); () = only the unlimited oracle
    oracle_corrections: tuple[Count, ...] = ()
    eval_clips: Int = 0  # test clips per language for the gate evaluation (0 = all)
    # the per-block baselines, the other targets' gates and the other verification variant run on the
    # first `detail_clips` of `eval_clips` (0 = all of them), every other row on all
    detail_clips: Int = 0
    registry_name: str = "speccap-gate"
    promote_budget: Share = 0.1  # the budget the champion is chosen at (quality on validation)
    promote_clips: Int = 50  # validation clips per language the candidates are decoded on (0 = all traced)


@params_class
class SweepParams:
    methods: tuple[Method, ...] = ("edge", "cloud", "ugsd")
    block_lens: tuple[NonNeg, ...] = (3, 5, 7, 10, 20, 50, 0)  # at decode.gate / decode.threshold; 0 = adaptive
    gates: dict[ScoreGate, tuple[Float, ...]] = field(  # at decode.block_len
        default_factory=lambda: {"entropy": (0.5, 1.0, 2.0), "margin": (0.1, 0.3, 0.5)})
    in_flight: tuple[NonNeg, ...] = ()  # pipelined runs at the default gate and L (blocks in flight, >= 1)
    clips: Int = 0  # test clips per language; 0 = the whole test split
    # edge-only, cloud-only and UGSD at decode's settings run on `clips`, the L, gate, pipelined and Q-S
    detail_clips: Int = 0  # sweeps on the first `detail_clips` of them (0 = all of `clips`)
    workers: NonNeg = 2  # processes, each with the models loaded once
    threads: Count = 1  # torch threads per worker
    # captions each worker decodes at once, one forward per model per step (batching.lockstep); above 1 the
    batch: Count = 1  # clocks are charged by decode.cost (a shared forward's seconds are no caption's own)
    # N > 0: batch-invariant stepping (batching.step_graphs.Invariant), every step over N rows at one shape:
    # on a GPU a caption then does not depend on its batch (N >= 2 x batch: a loop may hold two sessions)
    invariant_rows: NonNeg = 0
    prompt_cache_mb: NonNeg = 0  # prompts kept per model and worker, MiB (0: off; docs/decoding.md)
    audio_cache_mb: NonNeg = 256  # clips' audio encodings kept the same way
    runs_dir: str = "reports/runs"
    # Q-S next to speculative sampling, every block verified, at this temperature: one configuration
    # per lattice level (0 = the adaptive policy choosing L and level per round) plus the dense baseline
    qs_levels: tuple[NonNeg, ...] = ()
    qs_temperature: Positive = 1.0


@params_class
class QSParams:
    # Q-S (decode.rule qs, or sq: the biased sample-then-quantize order): the edge's draft
    # distribution on the lattice {b / level : sum b = level}, sent sparsely
    level: Count = 16
    # what the adaptive policy (L and level per round) picks from
    levels: Annotated[tuple[Count, ...], Field(min_length=1)] = (2, 4, 8, 16, 32, 64)
    l_max: Count = 8  # the longest draft the adaptive policy plans


@params_class
class WisvTraceParams:
    train_clips: Int = 100  # clips per language traced for the head (0 = all)
    val_clips: Int = 30
    block_len: Count = 5
    critical_margin: Float = 1.0  # as gates.traces: quality points a kept draft token must cost


def _wisv_channels() -> dict:
    """The evaluation's channels: 20 / 500 Mbps uplink x 5 / 50 ms RTT, and the two-state Markov one."""
    out = {f"up{up}-rtt{rtt}": LinkConfig(f"up{up}-rtt{rtt}", float(up), float(down), float(rtt))
           for up, down in ((20, 100), (500, 1000)) for rtt in (5, 50)}
    out["markov"] = LinkConfig("markov", 4.0, 4.0, 20.0, markov=MarkovParams())
    return out


@params_class
class WisvParams:
    # CSI-aware acceptance (decoding/wisv/rule.py, decoding/wisv/training.py): traces with hidden states -> relabeled
    # critical mismatches under drawn channels -> the decision head -> evaluation over channels
    traces: WisvTraceParams = field(default_factory=WisvTraceParams)
    # smoothed importance: weight kappa^|m - m'| of a neighbouring critical mismatch
    kappa: Annotated[float, Strict(), Field(ge=0, lt=1)] = 0.5
    policy_temperature: Float = 0.1  # T of P(repair) = sigmoid((s - lambda) / T)
    budget_min: Unit = 0.2  # share of critical mismatches repaired on the worst channel ...
    budget_max: Unit = 1.0  # ... and on the best
    csi_draws: Count = 4  # channels drawn per traced caption
    hidden: Count = 64  # head width
    dropout: Float = 0.1
    epochs: Count = 300  # at most: early stopping on held-out captions ends it sooner (patience)
    lr: Float = 0.01
    # where the judged mismatches come from: shadow = the traces stage's on-policy traces (shared with
    # the token gates); own = greedy-verified traces of its own (wisv.traces)
    labels: Literal["own", "shadow"] = "shadow"
    rank: NonNeg = 8  # each hidden state through a learned projection to this many dims (0 = raw concatenation)
    scalars: Bool = True  # the head also reads the cloud's scalars about the token (decoding.wisv.training.CLOUD_SCALARS)
    weight_decay: NonNegFloat = 0.01
    patience: NonNeg = 30  # epochs without a better held-out loss before training stops (0 = no early stopping)
    # > 0: a factored head (decoding.wisv.training.DecisionHead): a criticality score of the token that also learns
    # the raw critical flags (this weight on that loss) plus a linear channel term; 0 = one network
    # that reads the CSI beside the token and learns the relabeled target only
    critical_weight: NonNegFloat = 1.0
    tau: Unit = 0.5  # tolerate a mismatch when P(reject) < tau
    max_rank: NonNeg = 0  # and only when the draft token is in the cloud's top max_rank (0 = no cap)
    protocol: Literal["auto", "full", "selective"] = "auto"  # auto: full or selective per round, on the link model
    registry_name: str = "speccap-wisv-head"
    block_lens: Annotated[tuple[Count, ...], Field(min_length=1)] = (4, 8)  # draft windows of the evaluation
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
    privacy: PrivacyParams = field(default_factory=PrivacyParams)
    uplink: UplinkParams = field(default_factory=UplinkParams)
    cluster: ClusterParams = field(default_factory=ClusterParams)

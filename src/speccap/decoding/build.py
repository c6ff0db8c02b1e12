"""The one place a speculative decoder is assembled: a frozen `DecodeSpec` (what to decode with, as
data) and `build_decoder`, which turns it into the `SpecSettings` the loops run. The CLI, the
networked edge, every stage and every benchmark describe their decoder as a spec and build it here;
nothing changes a decoder after it is built.

Learned parts come from outside this layer: a learned gate through the caller's `learned(spec)`
(from models/gates/ or the MLflow registry), the WISV head as an object (None on a networked edge,
whose server holds the head)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import get_args

from ..config import DecodeParams, Params
from ..params_types import GateName
from .cost import CostModel
from .gates import Gate, make_gate
from .halves import SpecSettings
from .link import Link
from .policies import Fixed, LengthPolicy, UGSDAdaptive
from .qs import QSAdaptive
from .rules import make_rule
from .verify import Rank, Rule, rule_for_gate
from .wisv.rule import WISV

RULE_GATES = get_args(GateName)  # every other gate name is a learned gate


@dataclass(frozen=True)
class DecodeSpec:
    """How one speculative caption is decoded (defaults: params.yaml's `decode:` defaults)."""
    gate: str = "entropy"  # a rule gate (RULE_GATES), a learned gate's name, "champion" or a gate file
    threshold: float | dict | None = 1.0  # None: never/always; a learned gate's default (its promote budget)
    gate_temperature: float | None = None  # the entropy gate's, tuned on validation (None: temperature 1)
    block_len: int = 5  # fixed draft length L; 0 = the UGSD adaptive rule
    adaptive: tuple[int, int, int] = (2, 5, 8)  # UGSD's L_min, L_base, L_max
    rule: str = "rank"  # a decode.rule name, or "wisv" (greedy localization judged by the head)
    rank: int = 2  # R of the rank rule
    temperature: float = 0.0
    qs_level: int = 16  # lattice level of the qs / sq rules
    qs_adaptive: bool = False  # Q-S with L and level chosen per round (decoding.qs.QSAdaptive)
    qs_levels: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    qs_l_max: int = 8
    token: str | None = None  # verify flagged tokens at once, "alone" or with the "pending" ones
    corrections: int | None = None  # the oracle at a budget: the first k tokens the cloud replaces
    gate_rank: str | None = None  # a language: judge a token gate's flagged tokens by its own R there
    fold: int | None = None  # cross-fitting: the learned gate that never saw this fold
    tau: float = 0.5  # WISV: tolerate a mismatch when P(reject) < tau
    wisv_protocol: str = "auto"
    wisv_max_rank: int = 0
    cloud_cache: bool = True  # False: re-encode audio and prefix at every escalation (the published baseline)
    in_flight: int = 0
    draft_ahead: str = "adaptive"
    edge_time_scale: float = 1.0
    cloud_time_scale: float = 1.0
    cost: CostModel | None = None  # the clock's charge per model call (None: measured compute)
    max_new_tokens: int = 128
    seed: int = 0

    @classmethod
    def from_params(cls, params: Params, decode: DecodeParams | None = None, **overrides) -> DecodeSpec:
        """The spec params.yaml describes (`decode`, or the `decode` given, `qs`, `wisv`,
        `models.max_new_tokens`, `seed`), with `overrides` on top."""
        d = params.decode if decode is None else decode
        # each value read only when no override replaces it: what a stage reads of params is what
        # its outputs depend on (speccap.params_reads records it; stage_params checks it)
        source = dict(gate=lambda: d.gate, threshold=lambda: _threshold(d, overrides),
                      block_len=lambda: d.block_len, adaptive=lambda: _adaptive(d), rule=lambda: d.rule,
                      rank=lambda: d.rank, temperature=lambda: d.temperature, qs_level=lambda: params.qs.level,
                      qs_levels=lambda: tuple(params.qs.levels), qs_l_max=lambda: params.qs.l_max,
                      tau=lambda: params.wisv.tau, wisv_protocol=lambda: params.wisv.protocol,
                      wisv_max_rank=lambda: params.wisv.max_rank, in_flight=lambda: d.in_flight,
                      draft_ahead=lambda: d.draft_ahead, edge_time_scale=lambda: d.edge_time_scale,
                      cloud_time_scale=lambda: d.cloud_time_scale, cost=lambda: CostModel.from_params(d.cost),
                      max_new_tokens=lambda: params.models.max_new_tokens, seed=lambda: params.seed)
        final = {k: overrides[k] if k in overrides else source[k]() for k in ("rule", "block_len", "in_flight")}
        unused = _unused(final["rule"], final["block_len"], final["in_flight"], overrides.get("qs_adaptive", False),
                         overrides.get("token") is not None)
        values = {k: read() for k, read in source.items() if k not in overrides and k not in final and k not in unused}
        return cls(**(values | final | overrides))

    def replace(self, **changes) -> DecodeSpec:
        return dataclasses.replace(self, **changes)


def _threshold(d: DecodeParams, overrides: dict) -> float | None:
    gate = overrides["gate"] if "gate" in overrides else d.gate
    return None if gate in ("never", "always") else d.threshold


def _unused(rule: str, block_len: int, in_flight: int, qs_adaptive: bool, token_level: bool) -> set[str]:
    """The spec's fields the decoder it describes never looks at (build_decoder's own conditions):
    they keep their defaults instead of being read from params."""
    unused = set()
    if rule != "rank":
        unused.add("rank")
    if block_len != 0 or token_level:  # a token gate drafts until it flags a token: no draft length
        unused.add("adaptive")
    if rule not in ("qs", "sq"):
        unused.add("qs_level")
    if not qs_adaptive:
        unused |= {"qs_levels", "qs_l_max"}
    if rule != "wisv":
        unused |= {"tau", "wisv_protocol", "wisv_max_rank"}
    if not in_flight:  # only the pipelined loop drafts ahead
        unused.add("draft_ahead")
    return unused


def _adaptive(d: DecodeParams) -> tuple[int, int, int]:
    a = d.adaptive
    return a.l_min, a.l_base, a.l_max


def build_decoder(spec: DecodeSpec, *, learned: Callable[[DecodeSpec], Gate] | None = None, head=None,
                  link: Link | None = None, vocab: int = 0, observer=None, trace_hidden: bool = False) -> SpecSettings:
    """The runnable decoder `spec` describes. `learned(spec)`: the learned gate a name that is not a
    rule gate stands for; `head`: the WISV decision head; `link` and `vocab`: what adaptive Q-S plans
    with; `observer` and `trace_hidden`: what trace collection reads (SpecSettings)."""
    gate = _gate(spec, learned)
    rule = _rule(spec, gate, head)
    return SpecSettings(gate=gate, rule=rule, policy=_policy(spec, rule, link, vocab), temperature=spec.temperature,
                        max_new_tokens=spec.max_new_tokens, seed=spec.seed, cloud_cache=spec.cloud_cache,
                        in_flight=spec.in_flight,
                        draft_ahead=spec.draft_ahead, edge_time_scale=spec.edge_time_scale,
                        cloud_time_scale=spec.cloud_time_scale, cost=spec.cost, observer=observer,
                        trace_hidden=trace_hidden)


def _gate(spec: DecodeSpec, learned) -> Gate:
    if spec.gate in RULE_GATES:
        gate = make_gate(spec.gate, None if spec.gate in ("never", "always") else spec.threshold,
                         temperature=spec.gate_temperature)
    elif spec.gate_temperature is not None:
        raise ValueError(f"a gate temperature ({spec.gate_temperature}) is the entropy gate's: "
                         f"gate {spec.gate!r} has none")
    elif learned is None:
        raise ValueError(f"gate {spec.gate!r} is a learned gate: the decoder needs a way to load it")
    else:
        gate = learned(spec)
    return gate if spec.token is None else gate.at_token_level(spec.token)


def _rule(spec: DecodeSpec, gate: Gate, head) -> Rule:
    if spec.rule == "wisv":  # greedy localization, the trained head judging each mismatch
        return WISV(head, spec.tau, spec.wisv_protocol, spec.wisv_max_rank)
    rule = make_rule(spec.rule, spec.rank, spec.temperature or 1.0, spec.qs_level)
    if spec.corrections is not None:  # blocking loop only: the pipelined one adds bonus tokens
        if spec.in_flight or not isinstance(rule, Rank):
            raise ValueError("a correction allowance needs the rank rule and the blocking loop")
        rule = Rank(rule.r, spec.corrections)
    return rule if spec.gate_rank is None else rule_for_gate(rule, gate, spec.gate_rank)


def _policy(spec: DecodeSpec, rule: Rule, link: Link | None, vocab: int) -> LengthPolicy:
    if spec.qs_adaptive:  # L and level per round from the channel and the acceptance seen
        if link is None or not vocab:
            raise ValueError("adaptive Q-S plans with the link and the vocabulary size: pass both")
        return QSAdaptive(rule, link, vocab, spec.qs_levels, spec.qs_l_max)
    return UGSDAdaptive(*spec.adaptive) if spec.block_len == 0 else Fixed(spec.block_len)

"""The one decoder builder: a spec in, a runnable decoder out, nothing changed after."""

import dataclasses

import pytest

from speccap.config import params_from_dict
from speccap.decoding.build import DecodeSpec, build_decoder
from speccap.decoding.engine import cloud_only, edge_only, speculative
from speccap.decoding.gates import Always, Entropy, Never
from speccap.decoding.policies import Fixed, UGSDAdaptive
from speccap.decoding.qs import QSAdaptive, QuantizeSample
from speccap.decoding.verify import Rank, SpecSampling
from speccap.decoding.wisv.rule import WISV

from ..serving.conftest import link


def test_from_params_reads_decode_qs_wisv_and_the_caption_length():
    p = params_from_dict({"decode": {"gate": "margin", "threshold": 0.2, "block_len": 0, "rule": "rank", "rank": 3,
                                     "in_flight": 2, "adaptive": {"l_min": 1, "l_base": 4, "l_max": 9}},
                          "qs": {"level": 8}, "wisv": {"tau": 0.3}, "models": {"max_new_tokens": 17}, "seed": 5})
    spec = DecodeSpec.from_params(p)
    assert (spec.gate, spec.threshold, spec.block_len, spec.adaptive, spec.rule, spec.rank) == \
        ("margin", 0.2, 0, (1, 4, 9), "rank", 3)
    assert (spec.in_flight, spec.max_new_tokens, spec.seed) == (2, 17, 5)
    # what the decoder never looks at keeps its default (and is not read: a stage's params are what it reads)
    assert (spec.qs_level, spec.tau) == (DecodeSpec.qs_level, DecodeSpec.tau) != (8, 0.3)
    assert DecodeSpec.from_params(p, rule="qs").qs_level == 8 and DecodeSpec.from_params(p, rule="wisv").tau == 0.3
    assert DecodeSpec.from_params(p, block_len=5).adaptive == DecodeSpec.adaptive
    assert DecodeSpec.from_params(p, token="alone").adaptive == DecodeSpec.adaptive
    # never and always take no threshold; overrides win
    assert DecodeSpec.from_params(p, gate="always", threshold=None).threshold is None
    assert DecodeSpec.from_params(params_from_dict({"decode": {"gate": "never"}})).threshold is None


def test_the_spec_is_frozen_and_so_is_the_decoder():
    spec = DecodeSpec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.gate = "always"
    settings = build_decoder(spec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.rule = Rank(1)


def test_each_part_is_built_from_the_spec():
    s = build_decoder(DecodeSpec(gate="entropy", threshold=0.7, block_len=0, adaptive=(2, 3, 6), rule="rank", rank=3))
    assert isinstance(s.gate, Entropy) and s.gate.describe()["threshold"] == 0.7
    assert isinstance(s.rule, Rank) and s.rule.r == 3
    assert isinstance(s.policy, UGSDAdaptive) and s.policy.l_max == 6
    s = build_decoder(DecodeSpec(gate="never", threshold=None, rule="spec_sampling", temperature=0.5, block_len=4))
    assert isinstance(s.gate, Never) and isinstance(s.rule, SpecSampling) and isinstance(s.policy, Fixed)
    s = build_decoder(DecodeSpec(gate="always", threshold=None, rule="qs", qs_level=8, temperature=0.8))
    assert isinstance(s.rule, QuantizeSample) and s.rule.level == 8
    assert build_decoder(DecodeSpec(gate="entropy", token="pending")).gate.level == "token"
    # the oracle at a budget: rank-R that replaces only the first k violators
    assert build_decoder(DecodeSpec(rule="greedy", corrections=2)).rule.max_corrections == 2
    with pytest.raises(ValueError, match="correction allowance needs the rank rule and the blocking loop"):
        build_decoder(DecodeSpec(rule="greedy", corrections=2, in_flight=1))


def test_adaptive_qs_plans_with_the_link_and_the_vocabulary():
    spec = DecodeSpec(gate="always", threshold=None, rule="qs", temperature=1.0, qs_adaptive=True)
    with pytest.raises(ValueError, match="link and the vocabulary"):
        build_decoder(spec)
    s = build_decoder(spec, link=link(), vocab=96)
    assert isinstance(s.policy, QSAdaptive) and s.policy.rule is s.rule


def test_learned_gates_come_from_the_callers_loader_and_judge_by_their_own_rank():
    class Flagging(Always):
        level, verify_rank = "token", {"en": 3}
    with pytest.raises(ValueError, match="'tok-x' is a learned gate"):
        build_decoder(DecodeSpec(gate="tok-x"))
    seen = []
    s = build_decoder(DecodeSpec(gate="tok-x", threshold=0.4, fold=2, rule="greedy", gate_rank="en"),
                      learned=lambda spec: seen.append(spec) or Flagging())
    assert isinstance(s.gate, Flagging) and (seen[0].threshold, seen[0].fold) == (0.4, 2)
    assert s.rule.r == 3  # the gate's R for the language
    s = build_decoder(DecodeSpec(gate="tok-x", rule="greedy", gate_rank="zh"), learned=lambda spec: Flagging())
    assert s.rule.r == 1  # none for zh: the spec's rule


def test_a_gate_temperature_is_the_entropy_gates_alone():
    s = build_decoder(DecodeSpec(gate="entropy", threshold=0.5, gate_temperature=0.5, token="alone"))
    assert isinstance(s.gate, Entropy) and s.gate.entropy_temperature == 0.5 and s.gate.level == "token"
    assert build_decoder(DecodeSpec(gate="entropy", threshold=0.5)).gate.entropy_temperature is None
    with pytest.raises(ValueError, match="gate 'tok-x' has none"):
        build_decoder(DecodeSpec(gate="tok-x", threshold=0.4, gate_temperature=0.5), learned=lambda spec: Always())


def test_wisv_gets_the_head_the_caller_loaded():
    s = build_decoder(DecodeSpec(gate="always", threshold=None, rule="wisv", tau=0.2, wisv_max_rank=3), head=None)
    assert isinstance(s.rule, WISV) and s.rule.head is None and (s.rule.tau, s.rule.max_rank) == (0.2, 3)


def test_the_built_decoder_keeps_the_loops_invariants(pair, audio):
    """Gate never is edge-only, gate always with greedy is cloud-only (greedy)."""
    edge, cloud = pair
    mel = audio[1]
    never = build_decoder(DecodeSpec(gate="never", threshold=None, block_len=4, max_new_tokens=12))
    assert speculative(edge, cloud, mel, "en", never, link()).token_ids == edge_only(edge, mel, "en", 12).token_ids
    always = build_decoder(DecodeSpec(gate="always", threshold=None, rule="greedy", block_len=3, max_new_tokens=12))
    assert speculative(edge, cloud, mel, "en", always, link()).token_ids == \
        cloud_only(cloud, mel, "en", link(), 12).token_ids

"""The verification rules by name (params decode.rule): the one place a name becomes a rule."""

from __future__ import annotations

from typing import get_args

from ..params_types import RuleName
from .qs import QuantizeSample, SampleQuantize
from .verify import Rank, Rule, SpecSampling

# every name decode.rule accepts ("wisv" is built with its trained head: decoding.wisv.WISV)
RULES = get_args(RuleName)


def make_rule(name: str, rank: int = 20, temperature: float = 1.0, level: int = 16) -> Rule:
    if name == "wisv":
        raise ValueError("the wisv rule needs its trained decision head: build it with "
                         "speccap.decoding.wisv.rule.WISV(load_head(path), tau) (the wisv_head stage trains one)")
    if name in ("qs", "sq"):
        return (QuantizeSample if name == "qs" else SampleQuantize)(level, temperature)
    if name == "greedy":
        return Rank(1)
    if name == "rank":
        return Rank(rank)
    if name == "spec_sampling":
        return SpecSampling(temperature)
    raise ValueError(f"unknown verification rule {name!r} (expected one of {', '.join(RULES)})")

"""Gates: should this drafted block go to the cloud?

`never` and `always` are the edge-only / cloud-verifies-everything ends. `entropy` is UGSD's
rule (eq. 2: escalate when the block's maximum token entropy exceeds gamma), at temperature 1 or
at the temperature tuned on validation (the entropy of softmax(logits / T)); `margin`
escalates when some token's top-1 / top-2 probability gap is below delta; `logprob` when some
drafted token's log-probability is below a threshold. A learned gate implements `score`
(higher = more likely to need the cloud) and escalates above its threshold.

Two levels. A block gate (`level = "block"`) looks at a drafted block of L tokens and sends all of
it or none. A token gate (`level = "token"`, `make_gate(..., level="token")`) scores each token as
it is drafted (`flag`: the last token of the pending block) and the loop verifies at once:
`verify = "alone"` sends only the flagged token (the unflagged tokens before it are committed as
drafted and reach the cloud as context), `verify = "pending"` sends every token drafted since
the last verification. With `always` every token is flagged; `never` flags none.

A token gate may also carry `verify_rank` (language -> R): how strictly its flagged tokens are
judged, chosen on validation by the `gates` stage (pipeline.verify_rank). The loops take the rule
they are given; `decoding.verify.rule_for_gate` is what a deployment applies before captioning.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import get_args

from ..params_types import GateName, VerifyName
from .stats import Block

VERIFY = get_args(VerifyName)


class Gate(ABC):
    name: str = "gate"
    level: str = "block"  # "block" | "token"
    verify: str = "alone"  # token level: what goes up with a flagged token (VERIFY)
    needs_hidden: bool = False  # its features read the edge's hidden state before each drafted token
    verify_rank: dict[str, int] | None = None  # token level: R per language its flagged tokens are judged by
    # the temperature the drafting edge computes each token's entropy at (None: the distribution it
    # drafts from); only a tuned entropy gate sets one
    entropy_temperature: float | None = None

    @abstractmethod
    def escalate(self, block: Block) -> bool:
        ...

    def flag(self, block: Block) -> bool:
        """Token level: should the last drafted token of `block` be verified now?"""
        return self.escalate(Block(block.start + len(block) - 1, block.tokens[-1:], block.stats[-1:],
                                   language=block.language))

    def at_token_level(self, verify: str = "alone") -> "Gate":
        """This gate, scoring each token as it is drafted (see the module's docstring)."""
        if verify not in VERIFY:
            raise ValueError(f"unknown token-level verification {verify!r} (expected one of {VERIFY})")
        self.level, self.verify = "token", verify
        return self

    def describe(self) -> dict:
        out = {"gate": self.name}
        if self.level == "token":
            out.update(level="token", verify=self.verify)
            if self.verify_rank:
                out["verify_rank"] = dict(self.verify_rank)
        return out


class Never(Gate):
    name = "never"

    def escalate(self, block: Block) -> bool:
        return False


class Always(Gate):
    name = "always"

    def escalate(self, block: Block) -> bool:
        return True


class ScoreGate(Gate):
    """Escalate when the block's score exceeds a threshold; subclasses define the score."""

    def __init__(self, threshold: float):
        self.threshold = float(threshold)

    @abstractmethod
    def score(self, block: Block) -> float:
        ...

    def token_score(self, block: Block, i: int) -> float:
        """Token i's score on the threshold's scale (a block's score is the maximum of these)."""
        return self.score(Block(block.start + i, block.tokens[i:i + 1], block.stats[i:i + 1], language=block.language))

    def threshold_for(self, language: str) -> float:
        return self.threshold

    def escalate(self, block: Block) -> bool:
        return len(block) > 0 and self.score(block) > self.threshold_for(block.language)

    def flag(self, block: Block) -> bool:
        return len(block) > 0 and self.token_score(block, len(block) - 1) > self.threshold_for(block.language)

    def describe(self) -> dict:
        return {**super().describe(), "threshold": self.threshold}


class Entropy(ScoreGate):
    name = "entropy"

    def __init__(self, threshold: float, temperature: float | None = None):
        super().__init__(threshold)
        if temperature is not None and not temperature > 0:
            raise ValueError(f"the entropy gate's temperature must be > 0, got {temperature}")
        self.entropy_temperature = None if temperature in (None, 1.0) else float(temperature)

    def describe(self) -> dict:
        out = super().describe()
        return out if self.entropy_temperature is None else {**out, "temperature": self.entropy_temperature}

    def score(self, block: Block) -> float:
        return max(s.entropy for s in block.stats)

    def token_score(self, block: Block, i: int) -> float:
        return block.stats[i].entropy


class _BelowThreshold(ScoreGate):
    """Escalate when some drafted token's statistic `stat` is below `value`: the score is the
    negated minimum, the threshold the negated value (so that higher still means more doubtful)."""

    stat = ""

    def __init__(self, value: float):
        super().__init__(-float(value))
        self.value = float(value)

    def score(self, block: Block) -> float:
        return -min(getattr(s, self.stat) for s in block.stats)

    def token_score(self, block: Block, i: int) -> float:
        return -getattr(block.stats[i], self.stat)

    def describe(self) -> dict:
        return {**super().describe(), "threshold": self.value}


class Margin(_BelowThreshold):
    """Escalate when some token's top-1 minus top-2 probability is below delta."""

    name, stat = "margin", "margin"


class LogProb(_BelowThreshold):
    """Escalate when some drafted token's log-probability is below the threshold."""

    name, stat = "logprob", "logprob"


def make_gate(name: str, threshold: float | None = None, level: str = "block", verify: str = "alone",
              temperature: float | None = None) -> Gate:
    """A rule gate; `level="token"` scores each token as it is drafted and verifies at once;
    `temperature`: the entropy gate's (None or 1: the entropy of the distribution drafted from)."""
    if level not in ("block", "token"):
        raise ValueError(f"unknown gate level {level!r} (expected 'block' or 'token')")
    gate = _make(name, threshold, temperature)
    return gate.at_token_level(verify) if level == "token" else gate


def _make(name: str, threshold: float | None, temperature: float | None) -> Gate:
    if temperature not in (None, 1.0) and name != "entropy":
        raise ValueError(f"a gate temperature ({temperature}) is the entropy gate's: gate {name!r} has none")
    simple = {"never": Never, "always": Always}
    if name in simple:
        return simple[name]()
    scored = {"entropy": Entropy, "margin": Margin, "logprob": LogProb}
    if name not in scored:
        raise ValueError(f"unknown gate {name!r} (expected one of {', '.join(get_args(GateName))})")
    if threshold is None:
        raise ValueError(f"gate {name!r} needs a threshold")
    return Entropy(threshold, temperature) if name == "entropy" else scored[name](threshold)

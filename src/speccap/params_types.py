"""The params schema's value types: numbers with their bounds, and every list of allowed names (a
Literal here is the one place the list is kept: decoding.rules and decoding.gates take theirs from
it). params_schema.py builds the sections from them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, Strict
from pydantic.dataclasses import dataclass as _pydantic_dataclass

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
# bounds, checked where the field is declared
Count = Annotated[int, Strict(), Field(ge=1)]  # at least one
NonNeg = Annotated[int, Strict(), Field(ge=0)]  # 0 allowed (often: all, none or adaptive)
Positive = Annotated[float, Strict(), Field(gt=0)]
NonNegFloat = Annotated[float, Strict(), Field(ge=0)]
Share = Annotated[float, Strict(), Field(gt=0, le=1)]  # a rate in (0, 1]
Unit = Annotated[float, Strict(), Field(ge=0, le=1)]  # in [0, 1]
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
Normalize = Literal["none", "clip"]  # what speccap.data.uplink removes from each band
VerifyName = Literal["alone", "pending"]  # what goes up with a token a token-level gate flags
params_class = _pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))

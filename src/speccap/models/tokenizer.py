"""The embedded default's tokenizer: BPE trained on the corpus captions (English + Chinese).

Metaspace pre-tokenization (spaces become '▁' and stay part of tokens) works for both
languages: English words and runs of Chinese characters both merge into pieces, and decoding
restores the spaces. The special tokens sit at fixed ids 0..10 and name the multimodal
placeholders the Qwen-Omni thinker classes need. Edge and cloud share this one tokenizer.
"""

from __future__ import annotations

import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from .configs import SpecialIds

PAD, EOS = "<pad>", "<|endoftext|>"
LANG_TOKENS = {"en": "<|en|>", "zh": "<|zh|>"}
SPECIAL_TOKENS = [PAD, EOS, LANG_TOKENS["en"], LANG_TOKENS["zh"], "<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>",
                  "<|IMAGE|>", "<|VIDEO|>", "<|vision_bos|>", "<|vision_eos|>"]


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    alphabet = sorted({ch for t in texts for ch in t.replace(" ", "▁")})
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=alphabet,
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS,
                                   additional_special_tokens=SPECIAL_TOKENS[2:])


def special_ids(tok) -> SpecialIds:
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return SpecialIds(audio=ids["<|AUDIO|>"], audio_start=ids["<|audio_bos|>"], audio_end=ids["<|audio_eos|>"],
                      image=ids["<|IMAGE|>"], video=ids["<|VIDEO|>"], vision_start=ids["<|vision_bos|>"],
                      vision_end=ids["<|vision_eos|>"], pad=ids[PAD], eos=ids[EOS])


def save_tokenizer(tok: PreTrainedTokenizerFast, directory: str | os.PathLike) -> None:
    tok.save_pretrained(str(directory))


def load_tokenizer(directory: str | os.PathLike) -> PreTrainedTokenizerFast:
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: tokenizer not found (run the train stage: dvc repro train)")
    return wrap(Tokenizer.from_file(str(path)))

import numpy as np
import pytest

from speccap.config import ThinkerSize
from speccap.models.configs import build_model
from speccap.models.thinker import PromptTemplate, ThinkerLM
from speccap.models.tokenizer import special_ids, train_tokenizer

TINY = ThinkerSize(text_hidden=32, text_layers=2, text_heads=4, text_kv_heads=2, text_ffn=64, audio_d=32,
                   audio_layers=1, audio_heads=2, audio_ffn=64)
VOCAB = 96


TEXTS = ["In the audio, a female speaker speaks with a raised tone. Therefore, the speaker exhibits anger.",
         "在音频中，一位男性说话者语调低沉。可以判断说话者感到悲伤。"] * 4


def tiny_tokenizer():
    return train_tokenizer(TEXTS, VOCAB)


def tiny_lm(family: str, seed: int = 0, vocab: int = VOCAB, n_mels: int = 128) -> ThinkerLM:
    """A tiny thinker of the real class with a real (tiny) BPE tokenizer, reading `n_mels` bands."""
    tok = tiny_tokenizer()
    special = special_ids(tok)
    model = build_model(family, vocab, TINY, special, n_mels, seed=seed)
    en, zh = tok.convert_tokens_to_ids("<|en|>"), tok.convert_tokens_to_ids("<|zh|>")
    return ThinkerLM(model, tok, PromptTemplate(prefix={"en": [12, 13]}, suffix={"en": [en], "zh": [zh]}),
                     special.eos, family)


@pytest.fixture(params=["qwen2_5_omni", "qwen3_omni_moe"])
def family(request):
    return request.param


@pytest.fixture
def mel():
    return np.random.default_rng(0).standard_normal((128, 230)).astype(np.float32)

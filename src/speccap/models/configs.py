"""Small configs of the real Qwen-Omni thinker classes, built with no download.

The embedded captioners are these classes at a few hundred thousand to a few million
parameters; the tests build the same classes to check the real loading and session code.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration, Qwen3OmniMoeThinkerForConditionalGeneration
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeThinkerConfig

from ..config import ThinkerSize

FAMILIES = ("qwen2_5_omni", "qwen3_omni_moe")


@dataclass(frozen=True)
class SpecialIds:
    """Where the multimodal placeholder tokens sit in the vocabulary."""

    audio: int
    audio_start: int
    audio_end: int
    image: int
    video: int
    vision_start: int
    vision_end: int
    pad: int
    eos: int

    @classmethod
    def at_end(cls, vocab_size: int) -> "SpecialIds":
        v = vocab_size
        return cls(audio=v - 1, audio_start=v - 2, audio_end=v - 3, image=v - 4, video=v - 5,
                   vision_start=v - 6, vision_end=v - 7, pad=0, eos=v - 8)


def _rope(head_dim: int) -> dict:
    # mrope sections (temporal, height, width) must sum to head_dim / 2
    half = head_dim // 2
    t = half - 2 * (3 * half // 8)
    return {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [t, 3 * half // 8, 3 * half // 8]}


def _vision(out_dim: int) -> dict:
    # the thinker always builds its vision tower; keep it minimal (never used: audio only)
    return dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=out_dim)


def build_config(family: str, vocab_size: int, size: ThinkerSize, special: SpecialIds, n_mels: int = 128):
    head_dim = size.text_hidden // size.text_heads
    audio = dict(num_mel_bins=n_mels, encoder_layers=size.audio_layers, encoder_attention_heads=size.audio_heads,
                 encoder_ffn_dim=size.audio_ffn, d_model=size.audio_d, output_dim=size.text_hidden,
                 max_source_positions=1500)
    text = dict(vocab_size=vocab_size, hidden_size=size.text_hidden, intermediate_size=size.text_ffn,
                num_hidden_layers=size.text_layers, num_attention_heads=size.text_heads,
                num_key_value_heads=size.text_kv_heads, max_position_embeddings=4096, rope_parameters=_rope(head_dim),
                pad_token_id=special.pad, eos_token_id=special.eos)
    ids = dict(audio_token_id=special.audio, audio_start_token_id=special.audio_start, image_token_id=special.image,
               video_token_id=special.video, vision_start_token_id=special.vision_start)
    if family == "qwen2_5_omni":
        vision = _vision(size.text_hidden) | {"fullatt_block_indexes": [0]}
        audio["n_window"] = 50
        return Qwen2_5OmniThinkerConfig(audio_config=audio, vision_config=vision, text_config=text,
                                        audio_end_token_id=special.audio_end, vision_end_token_id=special.vision_end,
                                        pad_token_id=special.pad, **ids)
    if family == "qwen3_omni_moe":
        audio.update(n_window=50, n_window_infer=100, conv_chunksize=500, downsample_hidden_size=32)
        vision = _vision(size.text_hidden) | {"patch_size": 4, "deepstack_visual_indexes": [0], "num_position_embeddings": 64}
        text.update(moe_intermediate_size=size.text_ffn // 2, num_experts=size.experts,
                    num_experts_per_tok=size.experts_per_token, head_dim=head_dim)
        cfg = Qwen3OmniMoeThinkerConfig(audio_config=audio, vision_config=vision, text_config=text, **ids)
        cfg.audio_end_token_id = special.audio_end
        return cfg
    raise ValueError(f"unknown thinker family {family!r} (expected one of {FAMILIES})")


def model_class(family: str):
    return {"qwen2_5_omni": Qwen2_5OmniThinkerForConditionalGeneration,
            "qwen3_omni_moe": Qwen3OmniMoeThinkerForConditionalGeneration}[family]


def build_model(family: str, vocab_size: int, size: ThinkerSize, special: SpecialIds, n_mels: int = 128, seed: int = 0):
    import torch
    torch.manual_seed(seed)
    return model_class(family)(build_config(family, vocab_size, size, special, n_mels))

"""The decoding step of a Qwen2.5-Omni thinker's text model, without transformers' per-call machinery.

Speculative decoding calls the model once per drafted token and once per verified block: forwards
of 1 to 8 tokens on a KV cache. For the embedded captioners (2 layers, 96-128 wide) the arithmetic
is a small part of such a call; most of it is transformers' generic plumbing around it (output
capturing, mask building, rotary-embedding modules, module hooks; profiled: the linear layers
took 14% of a speculative caption's time). This step does the same arithmetic in the same order on the
model's own weights and the session's own `DynamicCache` (so rollback and the HF path keep
working on it), and nothing else. `supports()` says when it applies: the Qwen2.5-Omni text
decoder with full attention, SDPA or eager attention, in eval mode; anything else takes HF's
forward. tests/models/test_fast_step.py holds it to HF's forward (the same logits and hidden
states, bit for bit); tests/models/test_hf_generate.py holds the sessions to HF `generate`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _text_model(model):
    """The thinker's text decoder (Qwen2_5OmniThinkerTextModel), or None."""
    inner = getattr(model, "model", None)
    return getattr(inner, "language_model", None)


def supports(model) -> bool:
    text = _text_model(model)
    if text is None or type(text).__name__ != "Qwen2_5OmniThinkerTextModel" or model.training:
        return False
    cfg = text.config
    return (not getattr(text, "has_sliding_layers", False)
            and getattr(cfg, "_attn_implementation", "sdpa") in ("sdpa", "eager")
            and getattr(model, "lm_head", None) is not None)


class FastStep:
    """`step(ids, positions, cache)` -> (logits (n, vocab), last hidden state (n, hidden)) for the
    tokens `ids` at rotary `positions` (1-D, text positions: the three M-RoPE rows are equal for
    text), appending their keys and values to `cache`."""

    def __init__(self, model):
        text = _text_model(model)
        cfg = text.config
        self.embed = text.embed_tokens.weight
        self.norm_w, self.norm_eps = text.norm.weight, text.norm.variance_epsilon
        self.lm_head = model.lm_head.weight
        self.layers = []
        for layer in text.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
                                a.q_proj, a.k_proj, a.v_proj, a.o_proj.weight,
                                layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon,
                                m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight, a.layer_idx))
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scaling = self.head_dim ** -0.5
        rotary = text.rotary_emb
        self.rotary = rotary  # its inv_freq is a buffer: read at each call, wherever the model has moved it
        self.rope_scale = rotary.attention_scaling
        self.sdpa = getattr(cfg, "_attn_implementation", "sdpa") == "sdpa"
        if cfg.hidden_act != "silu":
            raise ValueError(f"fast step: activation {cfg.hidden_act!r} is not SiLU")

    @staticmethod
    def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x.to(dtype)

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # HF builds one row per M-RoPE section and interleaves them; for text all rows hold the same
        # position, so each frequency sees exactly this product
        freqs = positions[:, None].float() * self.rotary.inv_freq.to(device=positions.device, dtype=torch.float)
        cos, sin = freqs.cos() * self.rope_scale, freqs.sin() * self.rope_scale
        cos, sin = torch.cat((cos, cos), -1).to(dtype), torch.cat((sin, sin), -1).to(dtype)
        return cos[None, None], sin[None, None]  # (1, 1, n, head_dim)

    def _attend(self, q, k, v, n: int) -> torch.Tensor:
        groups = self.heads // self.kv_heads
        past = k.shape[2] - n
        if n == 1:
            mask = None  # one query sees every cached position
        else:  # query i sees the cache and the new tokens up to itself
            rows, cols = torch.arange(n, device=k.device), torch.arange(k.shape[2], device=k.device)
            mask = (rows[:, None] + past >= cols[None, :])[None, None]
        if self.sdpa:
            if groups > 1 and mask is None:
                return F.scaled_dot_product_attention(q, k, v, scale=self.scaling, enable_gqa=True)
            if groups > 1:
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        w = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        if mask is not None:
            w = w.masked_fill(~mask, torch.finfo(w.dtype).min)
        w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, v)

    def step(self, ids: torch.Tensor, positions: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        n = ids.shape[0]
        h = F.embedding(ids, self.embed)[None]  # (1, n, hidden)
        cos, sin = self._rope(positions, h.dtype)
        for (ln1, eps1, qp, kp, vp, o_w, ln2, eps2, gate_w, up_w, down_w, idx) in self.layers:
            x = self._rms(h, ln1, eps1)
            q = F.linear(x, qp.weight, qp.bias).view(1, n, -1, self.head_dim).transpose(1, 2)
            k = F.linear(x, kp.weight, kp.bias).view(1, n, -1, self.head_dim).transpose(1, 2)
            v = F.linear(x, vp.weight, vp.bias).view(1, n, -1, self.head_dim).transpose(1, 2)
            q = (q * cos) + (self._rotate_half(q) * sin)
            k = (k * cos) + (self._rotate_half(k) * sin)
            k, v = cache.update(k, v, idx)
            a = self._attend(q, k, v, n).transpose(1, 2).reshape(1, n, -1)
            h = h + F.linear(a, o_w)
            x = self._rms(h, ln2, eps2)
            h = h + F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)
        h = self._rms(h, self.norm_w, self.norm_eps)
        return F.linear(h, self.lm_head)[0], h[0]

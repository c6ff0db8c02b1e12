"""The lean decoding step against transformers' own forward: the same numbers, bit for bit."""

import pytest
import torch

from speccap.models import fast_step

from .conftest import tiny_lm


def _walk(lm, mel, fast: bool):
    """A session's life: token-by-token drafting, a multi-token verify, a rollback, more tokens;
    every step's logits and last hidden state."""
    lm.use_fast_step = fast
    s = lm.start(mel, "en")
    outs, tok = [], int(s.prefill_logits.argmax())
    for _ in range(12):
        o = s.extend([tok], return_hidden=True)
        outs.append(o)
        tok = int(o.logits[-1].argmax())
    outs.append(s.extend([5, 7, 9, 11], return_hidden=True))  # a block of four on the cache
    s.rollback(3)
    outs.append(s.extend([6], return_hidden=True))
    outs.append(s.extend([8, 10], return_hidden=False))
    return outs, s.length


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_fast_step_gives_hf_forwards_logits_and_hidden_states_bit_for_bit(mel, attention):
    lm = tiny_lm("qwen2_5_omni")
    lm.model.set_attn_implementation(attention)
    assert lm.fast() is not None and lm.fast().sdpa == (attention == "sdpa")
    hf, hf_len = _walk(lm, mel, fast=False)
    fast, fast_len = _walk(lm, mel, fast=True)
    assert hf_len == fast_len == 12 + 4 - 3 + 1 + 2
    for a, b in zip(hf, fast):
        assert torch.equal(a.logits, b.logits)
        assert (a.hidden is None and b.hidden is None) or torch.equal(a.hidden, b.hidden)


def test_fast_step_applies_only_where_it_computes_what_hf_does():
    lm = tiny_lm("qwen2_5_omni")
    assert fast_step.supports(lm.model)
    lm.model.train()  # training goes through HF (dropout, gradients, the auxiliary probes)
    assert not fast_step.supports(lm.model) and lm.fast() is None
    lm.model.eval()
    lm.use_fast_step = False
    assert lm.fast() is None
    assert not fast_step.supports(tiny_lm("qwen3_omni_moe").model)  # another decoder: HF's forward

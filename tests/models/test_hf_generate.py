"""The session code (prefill, cached extension, language mask) captions exactly as HF `generate`
does on the same model, token for token, for both thinker classes and both caption languages.
Qwen2.5-Omni sessions extend through models.fast_step, so this holds it to `generate` as well."""

import pytest
import torch

from speccap.models.generate import generate

from .conftest import tiny_lm


@pytest.mark.parametrize("language", ["en", "zh"])
def test_session_greedy_equals_hf_generate(family, mel, language):
    lm = tiny_lm(family, seed=3)
    ours = generate(lm, mel, language, max_new_tokens=12)
    ids = torch.tensor([lm.prompt_ids(mel.shape[1], language)])
    out = lm.model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids),
        input_features=torch.as_tensor(mel)[None], feature_attention_mask=torch.ones(1, mel.shape[1], dtype=torch.long),
        max_new_tokens=12, do_sample=False, eos_token_id=lm.eos_token_id, pad_token_id=lm.pad_token_id,
        # the same tokens the session forbids for this caption language
        suppress_tokens=lm.blocked_ids(language).tolist())
    theirs = out[0, ids.shape[1]:].tolist()
    if theirs and theirs[-1] == lm.eos_token_id:
        theirs = theirs[:-1]
    assert ours.token_ids == theirs
    assert len(theirs) >= 3  # a real caption was compared, not two empty ones

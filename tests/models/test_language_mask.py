import torch

from speccap.models import language_mask
from speccap.models.generate import generate

from .conftest import tiny_lm


def test_each_language_blocks_the_other_script_and_the_markers(family):
    lm = tiny_lm(family)
    tok = lm.tokenizer
    texts = {i: tok.decode([i]) for i in range(lm.vocab_size)}
    for lang, foreign in (("en", language_mask.CJK), ("zh", language_mask.LATIN)):
        blocked = set(lm.blocked_ids(lang).tolist())
        assert {i for i, t in texts.items() if foreign.search(t)} - {lm.eos_token_id} <= blocked
        assert lm.eos_token_id not in blocked
        assert tok.convert_tokens_to_ids("<|AUDIO|>") in blocked and tok.convert_tokens_to_ids("<|en|>") in blocked
        allowed = [t for i, t in texts.items() if i not in blocked and i != lm.eos_token_id]
        assert allowed and not any(foreign.search(t) for t in allowed)


def test_sessions_never_commit_a_blocked_token(family, mel):
    lm = tiny_lm(family, seed=3)
    for lang in ("en", "zh"):
        s = lm.start(mel, lang)
        blocked = lm.blocked_ids(lang)
        assert torch.all(s.prefill_logits[blocked] == language_mask.BLOCKED_LOGIT)
        assert torch.all(s.extend([lm.eos_token_id, 20]).logits[:, blocked] == language_mask.BLOCKED_LOGIT)
        g = generate(lm, mel, lang, max_new_tokens=24, temperature=1.5, seed=1)  # sampling too
        assert not set(g.token_ids) & set(blocked.tolist())
        foreign = language_mask.CJK if lang == "en" else language_mask.LATIN
        assert g.caption and not foreign.search(g.caption)


def test_unknown_language_is_a_clear_error(family):
    lm = tiny_lm(family)
    import pytest
    with pytest.raises(ValueError, match="no language mask for caption language 'fr'"):
        lm.blocked_ids("fr")

import numpy as np
import pytest
import torch

from speccap.models.base import shared_vocab
from speccap.models.thinker import AudioCache, PromptCache, audio_token_count, chunk_frames, prefill

from .conftest import VOCAB, tiny_lm

TOKENS = [10, 11, 12, 13, 14, 15]


def test_prefill_and_extend_shapes(family, mel):
    lm = tiny_lm(family)
    s = lm.start(mel, "en")
    assert s.prefill_logits.shape == (VOCAB,) and s.length == 0
    out = s.extend(TOKENS, return_hidden=True)
    assert out.logits.shape == (6, VOCAB) and out.hidden.shape == (6, 32) and s.length == 6
    assert s.prompt_len == len(lm.prompt_ids(230, "en"))


def test_prefill_hidden_is_the_state_that_gives_the_first_tokens_distribution(family, mel):
    # the last-layer state at the prompt's last position: the LM head over it is the first caption
    # token's distribution (where the language mask allows), as each extend's hidden gives the next
    lm = tiny_lm(family)
    assert lm.start(mel, "en").prefill_hidden is None  # collected only when asked for
    s = lm.start(mel, "en", hidden=True)
    assert s.prefill_hidden.shape == (32,)
    head = lm.model.get_output_embeddings()
    allowed = s.prefill_logits > -1e8
    with torch.no_grad():
        torch.testing.assert_close(head(s.prefill_hidden)[:VOCAB][allowed], s.prefill_logits[allowed],
                                   atol=1e-4, rtol=1e-4)
        out = s.extend(TOKENS[:1], return_hidden=True)
        torch.testing.assert_close(head(out.hidden[-1])[:VOCAB][allowed], out.logits[-1][allowed],
                                   atol=1e-4, rtol=1e-4)


def test_cached_extension_equals_one_forward(family, mel):
    lm = tiny_lm(family)
    whole = lm.start(mel, "en").extend(TOKENS).logits
    s = lm.start(mel, "en")
    stepwise = torch.stack([s.extend([t]).logits[0] for t in TOKENS])
    torch.testing.assert_close(stepwise, whole, atol=1e-5, rtol=1e-4)
    s2 = lm.start(mel, "en")
    torch.testing.assert_close(torch.cat([s2.extend(TOKENS[:2]).logits, s2.extend(TOKENS[2:]).logits]), whole,
                               atol=1e-5, rtol=1e-4)


def test_rolled_back_session_equals_a_fresh_prefill(family, mel):
    lm = tiny_lm(family)
    s = lm.start(mel, "en")
    s.extend(TOKENS)
    s.rollback(4)
    assert s.length == 2
    after = s.extend([20, 21]).logits
    fresh = lm.start(mel, "en")
    expected = fresh.extend(TOKENS[:2] + [20, 21]).logits[2:]
    torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-4)
    # and the caches themselves hold the same keys and values
    for a, b in zip(s.cache.layers, fresh.cache.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-4)


def test_two_sessions_interleave_without_interference(family, mel):
    lm = tiny_lm(family)
    a, b = lm.start(mel, "en"), lm.start(mel[:, :100], "zh")
    a.extend(TOKENS[:3])
    b.extend([7, 8])
    rest = a.extend(TOKENS[3:]).logits
    torch.testing.assert_close(rest, lm.start(mel, "en").extend(TOKENS).logits[3:], atol=1e-5, rtol=1e-4)


def test_errors(family, mel):
    lm = tiny_lm(family)
    s = lm.start(mel, "en")
    with pytest.raises(ValueError, match="cannot roll back 1"):
        s.rollback(1)
    with pytest.raises(ValueError, match="at least one token"):
        s.extend([])
    with pytest.raises(ValueError, match="no prompt for caption language 'fr'"):
        lm.start(mel, "fr")
    with pytest.raises(ValueError, match="n_mels, frames"):
        lm.start(mel[0], "en")


def test_vocab_truncation_to_the_shared_size(mel):
    a, b = tiny_lm("qwen2_5_omni", vocab=VOCAB), tiny_lm("qwen2_5_omni", vocab=VOCAB + 32)
    assert shared_vocab(a, b) == VOCAB
    assert b.start(mel, "en").prefill_logits.shape == (VOCAB,)


def test_audio_tokens_grow_with_frames(family):
    lm = tiny_lm(family)
    counts = [audio_token_count(lm.model, n) for n in (100, 200, 400)]
    assert counts[0] < counts[1] < counts[2]


def _prompt_bits(s):
    return [s.prefill_logits, *(t for layer in s.cache.layers for t in (layer.keys, layer.values))]


def test_a_kept_prompt_starts_a_session_with_the_bits_of_its_own_prefill(family, mel):
    lm = tiny_lm(family)
    alone = lm.start(mel, "en", hidden=True)
    lm.prompts = PromptCache(2**20)
    first, second = lm.start(mel, "en", hidden=True), lm.start(mel.copy(), "en", hidden=True)
    assert (lm.prompts.misses, lm.prompts.hits) == (1, 1)  # the same features by content, not by object
    for s in (first, second):
        assert all(torch.equal(a, b) for a, b in zip(_prompt_bits(s), _prompt_bits(alone), strict=True))
        assert torch.equal(s.prefill_hidden, alone.prefill_hidden) and s.prompt_len == alone.prompt_len
    # a session extends and rolls back tensors of its own: the kept prompt, and a session from it, stay
    want = alone.extend(TOKENS).logits
    assert torch.equal(first.extend(TOKENS).logits, want)
    first.rollback(4)
    third = lm.start(mel, "en", hidden=True)
    assert torch.equal(third.extend(TOKENS).logits, want) and torch.equal(second.extend(TOKENS).logits, want)


def test_prompts_are_kept_per_clip_language_and_hidden_within_their_bytes(mel):
    lm = tiny_lm("qwen2_5_omni")
    lm.prompts = PromptCache(2**20)
    other = mel.copy()
    other[0, 0] += 1.0
    for f, lang, hidden in [(mel, "en", False), (other, "en", False), (mel, "zh", False), (mel, "en", True)]:
        lm.start(f, lang, hidden)
    assert (lm.prompts.misses, lm.prompts.hits) == (4, 0)
    one = lm.prompts.get(lm, mel, "en").nbytes
    assert lm.prompts.nbytes == sum(p.nbytes for p in lm.prompts._kept.values()) and one > 0
    lm.prompts = PromptCache(one + 1)  # room for one: the least recently used goes
    lm.start(mel, "en")
    lm.start(other, "en")
    lm.start(other, "en")
    lm.start(mel, "en")
    assert (lm.prompts.misses, lm.prompts.hits) == (3, 1) and len(lm.prompts._kept) == 1
    with pytest.raises(ValueError, match="max_bytes"):
        PromptCache(0)


def _clips(mel):
    """Three clips of different lengths (the batch pads the shorter ones)."""
    rng = np.random.default_rng(1)
    return [(mel, "en"), (rng.standard_normal((128, 170)).astype(np.float32), "zh"),
            (rng.standard_normal((128, 301)).astype(np.float32), "en")]


def _out_bits(out):
    return [out.logits, *out.hidden_states, *(t for layer in out.past_key_values.layers for t in (layer.keys, layer.values))]


def test_a_prefill_is_the_models_own_forward_over_the_audio(family, mel):
    """prefill places the audio encoding into the prompt itself: the same bits as the model's forward
    given the features."""
    lm = tiny_lm(family)
    clips = _clips(mel)
    with torch.inference_mode():
        made = prefill(lm, clips, hidden=True)
        ids = torch.full((3, max(made.lengths)), lm.pad_token_id)
        attn, fmask = torch.zeros_like(ids), torch.zeros((3, 301), dtype=torch.long)
        x = torch.zeros((3, 128, 301))
        for i, (f, language) in enumerate(clips):
            prompt = lm.prompt_ids(f.shape[1], language)
            ids[i, : len(prompt)], attn[i, : len(prompt)] = torch.tensor(prompt), 1
            x[i, :, : f.shape[1]], fmask[i, : f.shape[1]] = torch.from_numpy(f), 1
        positions, _ = lm.model.model.get_rope_index(ids, None, None, attn, False, fmask.sum(-1), None)
        own = lm.model(input_ids=ids, input_features=x, feature_attention_mask=fmask, attention_mask=attn,
                       position_ids=positions, use_cache=True, output_hidden_states=True)
    assert all(torch.equal(a, b) for a, b in zip(_out_bits(made.out), _out_bits(own), strict=True))


def test_kept_audio_encodings_give_a_batch_prefill_its_own_bits(family, mel):
    """A prefill from kept encodings equals one that encodes its batch, whatever the batch: clips of
    several chunks, a clip of one chunk beside longer ones, beside shorter ones only, and alone
    (the encoder's only chunk). Keeping them changes no output."""
    lm = tiny_lm(family)
    rng = np.random.default_rng(3)
    chunk = chunk_frames(lm)
    short = [(rng.standard_normal((128, n)).astype(np.float32), "en") for n in (chunk - 30, chunk // 2, chunk)]
    batches = [_clips(mel), short, short[1:2], short[:2], short[2:], [_clips(mel)[2], short[1]], _clips(mel)[2:]]
    kept = AudioCache(2**24)
    for batch in batches:
        with torch.inference_mode():
            lm.audio = None
            own = prefill(lm, batch, hidden=True).out
            lm.audio = kept
            from_kept = prefill(lm, batch, hidden=True).out
        assert all(torch.equal(a, b) for a, b in zip(_out_bits(from_kept), _out_bits(own), strict=True))
    assert kept.hits > 0 and kept.misses < sum(map(len, batches))
    # a session's start reads the kept encoding too (by content, not by object)
    hits = kept.hits
    lm.start(short[1][0].copy(), "en")
    assert kept.hits == hits + 1


def test_audio_encodings_are_kept_within_their_bytes(mel):
    lm = tiny_lm("qwen2_5_omni")
    width = chunk_frames(lm)
    lm.audio = AudioCache(2**20)
    one = lm.audio.get(lm, mel, width, alone=True)
    assert lm.audio.nbytes == one.numel() * one.element_size() > 0
    other = mel.copy()
    other[0, 0] += 1.0
    lm.audio = AudioCache(lm.audio.nbytes + 1)  # room for one: the least recently used goes
    for f in (mel, other, other, mel):
        lm.audio.get(lm, f, width, alone=True)
    assert (lm.audio.misses, lm.audio.hits) == (3, 1) and len(lm.audio._kept) == 1
    with pytest.raises(ValueError, match="max_bytes"):
        AudioCache(0)

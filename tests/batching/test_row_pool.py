"""Sessions as rows of one batched cache (batching.row_pool): a batch prefill starts every clip as
`ThinkerLM.start` does alone, and each row then extends as its own session does."""

import random

import numpy as np
import pytest
import torch

from speccap.batching.row_pool import RowPool, batchable
from speccap.models import language_mask
from speccap.models.thinker import PromptCache

from ..models.conftest import tiny_lm

CLIPS = [(230, "en"), (120, "zh"), (310, "en")]


def _features(n_mels=128):
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((n_mels, frames)).astype(np.float32), lang) for frames, lang in CLIPS]


def test_a_batch_prefill_starts_each_clip_as_it_starts_alone():
    lm = tiny_lm("qwen2_5_omni")
    pool = RowPool(lm, rows=2)  # three clips on two rows: the pool grows
    clips = _features()
    rows = pool.prefill([(f, lang, i == 1) for i, (f, lang) in enumerate(clips)])
    assert sorted(r.row for r in rows) == [0, 1, 2]
    for i, ((f, lang), got) in enumerate(zip(clips, rows)):
        alone = lm.start(f, lang, hidden=i == 1)
        assert got.prompt_len == alone.prompt_len and pool.length(got.row) == alone.prompt_len
        torch.testing.assert_close(got.prefill_logits, alone.prefill_logits, atol=1e-4, rtol=1e-4)
        assert int(got.prefill_logits.argmax()) == int(alone.prefill_logits.argmax())
        if i == 1:
            torch.testing.assert_close(got.prefill_hidden, alone.prefill_hidden, atol=1e-4, rtol=1e-4)
        else:
            assert got.prefill_hidden is None
        assert torch.equal(got.blocked, alone.blocked)
        # the row's cache is the clip's: a ragged step extends each as its own session does
        toks = [5, 6, 7][: i + 1]
        want = alone.extend(toks).logits
        have = pool.run([(got.row, toks)])[0][0]  # over the shared vocabulary, the language's ids blocked
        assert have.shape == want.shape
        assert torch.equal(have[:, got.blocked], torch.full_like(want[:, got.blocked], language_mask.BLOCKED_LOGIT))
        torch.testing.assert_close(have, want, atol=1e-4, rtol=1e-4)
        assert pool.length(got.row) == int(pool.cache.lengths[got.row]) == alone.prompt_len + len(toks)
    pool.release(rows[0].row)
    assert pool.length(rows[0].row) == 0
    assert pool.prefill([(clips[0][0], "en", False)])[0].row == rows[0].row  # the lowest free row first


def test_a_bad_clip_or_model_is_named():
    lm = tiny_lm("qwen2_5_omni")
    with pytest.raises(ValueError, match=r"\(n_mels, frames\)"):
        RowPool(lm, 2).prefill([(np.zeros(10, np.float32), "en", False)])
    with pytest.raises(ValueError, match="at least one row"):
        RowPool(lm, 0)
    moe = tiny_lm("qwen3_omni_moe")
    assert not batchable(moe)
    with pytest.raises(ValueError, match="cannot share a batched step"):
        RowPool(moe, 2)


def test_row_lengths_and_seconds_follow_every_step():
    """The pool's lengths (read by every loop, never from the device) stay the cache's through runs,
    rollbacks and releases; its forwards and prefills are timed."""
    lm = tiny_lm("qwen2_5_omni")
    pool = RowPool(lm, rows=3)
    rows = [r.row for r in pool.prefill([(f, lang, False) for f, lang in _features()])]
    assert pool.seconds["prefill"] > 0 and pool.seconds["run"] == 0
    pool.run([(rows[0], [5, 6]), (rows[2], [7])])
    pool.rollback(rows[0], 1)
    pool.run([(rows[1], [5, 6, 7]), (rows[0], [8])])
    pool.release(rows[2])
    assert pool.lengths == [int(n) for n in pool.cache.lengths]
    assert pool.seconds["run"] > 0 and pool.steps == 2 and pool.asked == 4
    # rollbacks reach the cache at the next forward: two of one row add up, a released row's are dropped
    held = pool.length(rows[1])
    pool.rollback(rows[1], 1)
    pool.rollback(rows[1], 2)
    pool.rollback(rows[0], 1)
    pool.release(rows[0])
    with pytest.raises(ValueError, match="cannot roll row"):
        pool.rollback(rows[1], pool.length(rows[1]) + 1)
    again = pool.prefill([(*_features()[0], False)])[0]  # into the released row
    pool.run([(rows[1], [9])])
    assert again.row == rows[0] and pool.length(again.row) == again.prompt_len
    assert pool.length(rows[1]) == held - 3 + 1
    assert pool.lengths == [int(n) for n in pool.cache.lengths]


def test_a_compact_step_over_few_rows_computes_what_the_full_step_does():
    """`compact`: a step that few rows ask for runs over copies of them alone, and writes back what
    it added: every output (within rounding), length and later step is the full step's."""
    lm = tiny_lm("qwen2_5_omni")
    clips = _features() * 2  # six rows; steps ask for one or two of them
    pools = [RowPool(lm, rows=6, compact=c) for c in ("off", "rounding")]
    rows = [[r.row for r in p.prefill([(f, lang, False) for f, lang in clips])] for p in pools]
    assert rows[0] == rows[1]
    rows = rows[0]
    for asks, back in ((((rows[5], [5, 6, 7]), (rows[1], [8])), {rows[5]: 1}),
                       (((rows[4], [9]),), {}),
                       (((rows[5], [10, 11]), (rows[1], [12, 13])), {}),
                       (((r, [14]) for r in rows), {})):  # every row asks: the full step, in both
        asks = list(asks)
        full, compact = (p.run(asks) for p in pools)
        for (lf, hf), (lc, hc) in zip(full, compact):  # a matrix product's rounding follows its shape
            torch.testing.assert_close(lc, lf, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(hc, hf, atol=1e-5, rtol=1e-5)
        for p in pools:
            for row, n in back.items():
                p.rollback(row, n)
    assert pools[1].lengths == pools[0].lengths == [int(n) for n in pools[1].cache.lengths]
    assert (pools[0].compacted, pools[1].compacted) == (0, 3)
    with pytest.raises(ValueError, match="compact must be one of"):
        RowPool(lm, rows=2, compact="sometimes")


def _random_steps(pools: list[RowPool], rows: list[int], steps: int, seed: int):
    """`steps` random requests (1 to 8 rows, 1 to 4 tokens each, some rolled back after), the same
    to every pool: yields each step's outputs per pool."""
    rng = random.Random(seed)
    for _ in range(steps):
        width = rng.choice([1, 1, 2, 3, 4])
        asks = [(row, [rng.randrange(5, 60) for _ in range(rng.randint(1, width))])
                for row in rng.sample(rows, rng.choice([1, 2, 3, 4, 5, 8]))]
        yield [p.run(asks) for p in pools]
        back = [(row, len(toks)) for row, toks in asks if rng.random() < 0.3]
        for p in pools:
            for row, n in back:
                p.rollback(row, n)


def test_bitwise_compact_steps_give_every_row_the_full_steps_bits():
    """`compact="bitwise"` (the batching executor's): at one thread, the steps it runs over copies
    of few rows give those rows every bit the full step gives them, through many steps, rollbacks
    and what later steps read back from the cache; at two threads it runs none."""
    lm = tiny_lm("qwen2_5_omni")
    rng = np.random.default_rng(7)
    clips = [(rng.standard_normal((128, int(rng.integers(80, 320)))).astype(np.float32), ("en", "zh")[i % 2])
             for i in range(16)]
    threads = torch.get_num_threads()
    try:
        for n_threads, compacted in ((1, True), (2, False)):
            torch.set_num_threads(n_threads)
            pools = [RowPool(lm, rows=16, compact=c) for c in ("off", "bitwise")]
            rows = [[r.row for r in p.prefill([(f, lang, False) for f, lang in clips])] for p in pools][0]
            for full, compact in _random_steps(pools, rows, 150, seed=n_threads):
                for (lf, hf), (lc, hc) in zip(full, compact):
                    assert torch.equal(lc, lf) and torch.equal(hc, hf)
            assert (pools[1].compacted > 30) is compacted and pools[0].compacted == 0
    finally:
        torch.set_num_threads(threads)


def test_with_kept_prompts_a_row_starts_from_the_bits_its_clip_has_alone():
    lm = tiny_lm("qwen2_5_omni")
    clips = _features()
    alone = [lm.start(f, lang) for f, lang in clips]
    lm.prompts = PromptCache(2**20)
    pool = RowPool(lm, rows=4)
    for _ in range(2):  # computed alone the first time, kept the second
        rows = pool.prefill([(f, lang, False) for f, lang in clips])
        for got, want in zip(rows, alone):
            assert torch.equal(got.prefill_logits, want.prefill_logits)
            # the row holds the clip's prompt: it extends as the clip's own session does
            have = pool.run([(got.row, [5, 6, 7])])[0][0]
            torch.testing.assert_close(have, want.extend([5, 6, 7]).logits, atol=1e-5, rtol=1e-5)
            want.rollback(3)
            pool.release(got.row)
    assert (lm.prompts.misses, lm.prompts.hits) == (3, 3)

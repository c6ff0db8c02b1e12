"""The one token loop every single-model caption runs through."""

import numpy as np
import pytest
import torch

from speccap.models.generate import autoregress, cdfs, draw, draw_from, greedy, greedy_run, greedy_tokens

from .conftest import tiny_lm


def _model(script: list[int], vocab: int = 8):
    """A 'model' whose next token after i tokens is script[i]; records what it is fed."""
    fed: list[int] = []

    def logits(i: int) -> torch.Tensor:
        row = torch.zeros(vocab)
        row[script[i]] = 1.0
        return row

    def feed(tok: int) -> torch.Tensor:
        fed.append(tok)
        return logits(len(fed))
    return logits(0), feed, fed


def test_the_end_token_is_seen_but_neither_kept_nor_fed():
    first, feed, fed = _model([3, 4, 7, 5])
    seen = []
    ids = autoregress(first, feed, eos=7, limit=10, seen=lambda i, tok, logits: seen.append((i, tok)))
    assert ids == [3, 4] and fed == [3, 4] and seen == [(0, 3), (1, 4), (2, 7)]


def test_the_limits_last_token_is_kept_but_not_fed():
    first, feed, fed = _model([3, 4, 5, 6])
    assert autoregress(first, feed, eos=7, limit=3) == [3, 4, 5] and fed == [3, 4]
    first, feed, fed = _model([3])
    assert autoregress(first, feed, eos=7, limit=0) == [] and fed == []


def test_choose_picks_from_each_rows_logits():
    first, feed, fed = _model([3, 4, 5, 7])
    # the token after the argmax: the end token's row gives 0, so the limit ends the caption
    ids = autoregress(first, feed, eos=7, limit=4, choose=lambda logits: (int(logits.argmax()) + 1) % 8)
    assert ids == [4, 5, 6, 0] and fed == [4, 5, 6]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_draw_takes_the_token_numpys_choice_takes_from_the_same_generator(dtype):
    make = np.random.default_rng(0)
    for seed in range(60):
        law = make.dirichlet(np.full(500, make.choice([0.05, 1.0]))).astype(dtype)
        law[make.integers(500, size=200)] = 0  # a lattice's zeros
        law *= make.choice([1.0, 3.0])  # weights, not yet a law
        ours, numpys = np.random.default_rng(seed), np.random.default_rng(seed)
        for _ in range(40):
            assert draw(torch.from_numpy(law) if seed % 2 else law, ours) == \
                int(numpys.choice(len(law), p=law / law.sum()))


def test_cdfs_of_a_steps_rows_draw_each_rows_token_to_the_bit():
    """What a sampling edge's step computes for every row at once draws the token `draw` draws from
    that row alone, from the same generator (the CDFs are the same to the bit)."""
    make = np.random.default_rng(3)
    laws = make.dirichlet(np.full(300, 0.1), size=9) * make.choice([1.0, 7.0], size=(9, 1))
    laws[2, :290] = 0  # mostly a lattice's zeros
    rows = cdfs(laws)
    for i, law in enumerate(laws):
        alone = np.cumsum(law / law.sum(), dtype=np.float64)
        assert np.array_equal(rows[i], alone / alone[-1])
        ours, theirs = np.random.default_rng(i), np.random.default_rng(i)
        assert [draw_from(rows[i], ours) for _ in range(30)] == [draw(law, theirs) for _ in range(30)]


@pytest.fixture(scope="module")
def thinker():
    return tiny_lm("qwen2_5_omni", seed=1)


@pytest.mark.parametrize("limit", [0, 1, 2, 6, 24])
@pytest.mark.parametrize("ending", [False, True])
def test_a_greedy_caption_as_one_run_is_autoregress_s(thinker, audio, limit, ending):
    """`greedy_run` on a session's `extend_run` writes the caption `autoregress` writes feeding token
    by token, sees each pick in the same order, and its forwards come where autoregress's come:
    after the pick they feed, before the next is seen."""
    mel = audio[1]
    sess = thinker.start(mel, "en")
    caption = autoregress(sess.prefill_logits, lambda tok: sess.extend([tok]).logits[-1], -1, 24)
    # an end token the caption meets mid-way: the first token not written before
    eos = next(t for i, t in enumerate(caption) if i >= 3 and t not in caption[:i]) if ending else -1

    def events_by_one():
        events, sess = [], thinker.start(mel, "en")

        def feed(tok):
            events.append(("forward", tok))
            return sess.extend([tok]).logits[-1]
        ids = autoregress(sess.prefill_logits, feed, eos, limit, seen=lambda i, tok, _: events.append((i, tok)))
        return ids, events

    def events_as_run():
        events, sess = [], thinker.start(mel, "en", summarize=greedy_tokens)

        def run(ids, steps, stop, before):
            made = sess.extend_run(ids, greedy_tokens, steps, stop)
            for j in range(made.forwards):
                before(made, j)
                events.append(("forward", ids[0] if j == 0 else made.summaries[j - 1]))
            return made
        ids = greedy_run(sess.prefill_summary, run, eos, limit, lambda i, tok: events.append((i, tok)))
        assert sess.prefill_summary == greedy(sess.prefill_logits)
        return ids, events

    want, got = events_by_one(), events_as_run()
    assert got == want
    assert want[0] == (caption[: caption.index(eos)] if ending and eos in caption[:limit] else caption[:limit])

import numpy as np

from speccap.decoding.stats import Block, ClipAudio, TokenStats, audio_summary
from speccap.gating.features import AUDIO, FEATURES, block_features


def _block(entropies, top1s, start=7, accept_rate=None, language="zh"):
    b = Block(start=start, accept_rate=accept_rate, audio=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0), language=language)
    for k, (e, t) in enumerate(zip(entropies, top1s)):
        b.tokens.append(k)
        b.stats.append(TokenStats(k, e, t, t / 2, np.log(t), k + 1))
    return b


def test_one_row_per_token_with_position_and_block_history():
    x = block_features(_block([0.5, 2.0, 1.0], [0.9, 0.3, 0.6], accept_rate=0.75))
    col = {name: x[:, i] for i, name in enumerate(FEATURES)}
    assert x.shape == (3, len(FEATURES)) and x.dtype == np.float32
    np.testing.assert_allclose(col["entropy"], [0.5, 2.0, 1.0])
    np.testing.assert_allclose(col["pos_in_caption"], [7, 8, 9])
    np.testing.assert_allclose(col["pos_in_block"], [0, 1, 2])
    np.testing.assert_allclose(col["block_max_entropy"], [0.5, 2.0, 2.0])  # the block turned unsure and stays so
    np.testing.assert_allclose(col["top1_change"], [0.0, -0.6, 0.3], atol=1e-6)
    np.testing.assert_allclose(col["log_rank"], np.log([1, 2, 3]), rtol=1e-6)
    assert (col["accept_rate"] == 0.75).all() and (col["has_accept_rate"] == 1).all() and (col["zh"] == 1).all()
    np.testing.assert_allclose(x[0, -len(AUDIO):], [1, 2, 3, 4, 5, 6])


def test_no_verdict_yet_is_marked():
    x = block_features(_block([1.0], [0.5], accept_rate=None, language="en"))
    col = dict(zip(FEATURES, x[0]))
    assert col["has_accept_rate"] == 0 and col["accept_rate"] == 1.0 and col["zh"] == 0


def test_audio_summary_sees_loudness_and_its_trend():
    quiet = np.full((128, 100), -1.0)
    rising = quiet + np.linspace(0, 1.0, 100)[None, :]
    a, b = audio_summary(quiet), audio_summary(rising)
    assert len(a) == len(AUDIO) and b[0] > a[0] and b[2] > 0.1 and abs(a[2]) < 1e-9
    assert audio_summary(np.zeros((128, 0))) == (0.0,) * 6


def test_a_blocks_clip_audio_is_the_summary_read_when_first_needed():
    mel = np.random.default_rng(0).normal(size=(128, 60))
    lazy = ClipAudio(mel)
    mel[:, :30] = 5.0  # not read yet: it sums up the log-mel as it is when a gate first reads it
    first = audio_summary(mel)
    assert tuple(lazy) == first and len(lazy) == len(AUDIO)
    mel[:] = 0.0  # read once, kept
    assert tuple(lazy) == first != audio_summary(mel)
    block = Block(start=0, tokens=[3], stats=[TokenStats(3, 1.0, 0.5, 0.1, -1.0, 1)], audio=lazy, language="en")
    assert np.allclose(block_features(block)[0, -len(AUDIO):], first)

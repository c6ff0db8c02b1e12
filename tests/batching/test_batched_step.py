"""Many sequences in one forward (batching.batched_step) against each sequence's own step: the same
logits and hidden states within float rounding, and the same argmax, through ragged requests, rows
sitting steps out, and per-row rollbacks."""

import numpy as np
import pytest
import torch

from speccap.batching.batched_step import BatchedCache, BatchedStep

from ..models.conftest import tiny_lm

# per step, per row: the tokens it asks for ([] sits the step out) or ("rollback", n)
SCRIPT = [
    [[3], [4, 5, 6], []],
    [[7, 8], [9], [10, 11, 12, 13]],
    [("rollback", 2), [14], [15]],
    [[16, 17, 18, 19, 20], ("rollback", 3), [21, 22]],
    [[23], [24, 25], ("rollback", 5)],
    [[26], [], [27, 28, 29]],
]


def _sessions(lm):
    rng = np.random.default_rng(3)
    return [lm.start(rng.standard_normal((128, frames)).astype(np.float32), lang)
            for frames, lang in ((230, "en"), (120, "zh"), (310, "en"))]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_every_row_computes_what_its_sequence_does_alone(attention):
    lm = tiny_lm("qwen2_5_omni")
    lm.model.set_attn_implementation(attention)
    single = lm.fast()
    sessions = _sessions(lm)
    batched = BatchedStep(lm.model)
    cache = BatchedCache(batched, rows=3, capacity=200)
    for row, s in enumerate(sessions):
        cache.load_row(row, s.cache, s.rope_delta)
    compared = 0
    for step in SCRIPT:
        asks = [a if isinstance(a, list) else [] for a in step]
        for row, a in enumerate(step):
            if isinstance(a, tuple):
                sessions[row].rollback(a[1])
                cache.rollback(row, a[1])
        n = max(len(a) for a in asks)
        ids = torch.tensor([a + [0] * (n - len(a)) for a in asks])
        logits, hidden = batched.step(ids, torch.tensor([len(a) for a in asks]), cache)
        for row, (a, s) in enumerate(zip(asks, sessions)):
            if not a:
                continue
            start = s.cache.get_seq_length()
            want_logits, want_hidden = single.step(torch.tensor(a), torch.arange(start, start + len(a)) + s.rope_delta,
                                                   s.cache)
            torch.testing.assert_close(logits[row, : len(a)], want_logits, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(hidden[row, : len(a)], want_hidden, atol=1e-5, rtol=1e-4)
            assert torch.equal(logits[row, : len(a)].argmax(-1), want_logits.argmax(-1))
            compared += 1
        assert cache.lengths.tolist() == [s.cache.get_seq_length() for s in sessions]
    assert compared == 13


def test_a_fixed_span_reads_no_more_than_the_rows_hold():
    """Attention over the whole capacity (the CUDA-graph form) sees what the exact span sees."""
    lm = tiny_lm("qwen2_5_omni")
    batched = BatchedStep(lm.model)
    caches = []
    for _ in range(2):
        c = BatchedCache(batched, rows=3, capacity=220)
        for row, s in enumerate(_sessions(lm)):
            c.load_row(row, s.cache, s.rope_delta)
        caches.append(c)
    ids, counts = torch.tensor([[3, 4], [5, 0], [6, 7]]), torch.tensor([2, 1, 2])
    exact = batched.step(ids, counts, caches[0])[0]
    full = batched.step(ids, counts, caches[1], span=220)[0]
    for row, n in enumerate(counts.tolist()):
        torch.testing.assert_close(full[row, :n], exact[row, :n], atol=1e-5, rtol=1e-4)


def test_a_cache_refuses_what_does_not_fit():
    lm = tiny_lm("qwen2_5_omni")
    s = _sessions(lm)[0]
    batched = BatchedStep(lm.model)
    small = BatchedCache(batched, rows=1, capacity=s.cache.get_seq_length() + 2)
    small.load_row(0, s.cache, s.rope_delta)
    with pytest.raises(ValueError, match="over the cache's"):
        batched.step(torch.tensor([[1, 2, 3]]), torch.tensor([3]), small)
    with pytest.raises(ValueError, match="cannot roll row 0 back by"):
        small.rollback(0, 10_000)
    with pytest.raises(ValueError, match="does not fit"):
        BatchedCache(batched, rows=1, capacity=4).load_row(0, s.cache)

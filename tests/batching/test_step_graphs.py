"""The batched step at fixed shapes (batching.step_graphs): bucketed rows and tokens, attention over the
whole capacity, the same logits as the eager step's; graphs dropped when the cache's tensors change;
steps too wide for a graph run eagerly. On CPU the fixed shapes run eagerly; the capture itself needs
CUDA (the last test, and `benchmarks/device_check.py` on a GPU)."""

import numpy as np
import pytest
import torch

from speccap.batching import row_pool
from speccap.batching.lockstep import decode_all
from speccap.batching.row_pool import RowPool
from speccap.batching.step_graphs import MAX_TOKENS, Invariant, StepGraphs
from speccap.models import thinker

from ..models.conftest import tiny_lm


def _pools(lm, rows, clips):
    eager, fixed = RowPool(lm, rows, graphs=False), RowPool(lm, rows, graphs=True)
    for pool in (eager, fixed):
        pool.prefill([(f, lang, False) for f, lang in clips])
    return eager, fixed


def _clips(n):
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((128, 90 + 40 * i)).astype(np.float32), ("en", "zh")[i % 2]) for i in range(n)]


def test_fixed_shapes_give_the_eager_steps_logits_and_lengths():
    lm = tiny_lm("qwen2_5_omni")
    eager, fixed = _pools(lm, 8, _clips(5))
    assert eager.graphs is None and isinstance(fixed.graphs, StepGraphs) and not fixed.graphs.capture
    # ragged steps over rows with gaps between them, then a step too wide for a graph
    steps = [[(0, [5, 6, 7]), (2, [8]), (4, [9, 10])], [(1, [11])], [(3, [12, 13, 14, 15, 16])],
             [(0, list(range(20, 20 + MAX_TOKENS + 3))), (4, [17])]]
    for asks in steps:
        for (want_l, want_h), (got_l, got_h) in zip(eager.run(asks), fixed.run(asks)):
            torch.testing.assert_close(got_l, want_l, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got_h, want_h, atol=1e-5, rtol=1e-5)
            assert torch.equal(got_l.argmax(-1), want_l.argmax(-1))
        assert fixed.lengths == eager.lengths
        assert torch.equal(fixed.cache.lengths, eager.cache.lengths)
    g = fixed.graphs
    # rows 0..4 -> 8 rows, 3 tokens -> 4; rows 0..1 -> 2, 1 -> 1; rows 0..3 -> 4, 5 -> 8
    assert set(g.graphs) == {(8, 4), (2, 1), (4, 8)} and g.eager == 1


def test_shapes_are_powers_of_two_within_the_cache():
    lm = tiny_lm("qwen2_5_omni")
    pool = RowPool(lm, 6, graphs=True)
    g = pool.graphs
    assert [g.shape(pool.cache, top, 1)[0] for top in (1, 2, 3, 5, 6)] == [1, 2, 4, 6, 6]
    assert [g.shape(pool.cache, 1, n)[1] for n in (1, 2, 3, 8, 9, MAX_TOKENS)] == [1, 2, 4, 8, 16, MAX_TOKENS]
    assert g.shape(pool.cache, 1, MAX_TOKENS + 1) is None


def test_a_grown_cache_drops_the_graphs_made_over_its_old_tensors():
    lm = tiny_lm("qwen2_5_omni")
    eager, fixed = _pools(lm, 2, _clips(2))
    for pool in (eager, fixed):
        pool.run([(0, [5])])
    assert len(fixed.graphs.graphs) == 1
    capacity = fixed.cache.capacity
    long = list(range(30, 30 + MAX_TOKENS))
    for _ in range(capacity // MAX_TOKENS + 1):  # past the room a row was given: the cache grows
        for want, got in zip(eager.run([(1, long)]), fixed.run([(1, long)])):
            torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    assert fixed.cache.capacity > capacity
    assert set(fixed.graphs.graphs) == {(2, MAX_TOKENS)}  # the (1, 1) shape went with the old tensors
    for want, got in zip(eager.run([(0, [6])]), fixed.run([(0, [6])])):
        torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)


def test_batch_invariant_stepping_runs_every_step_at_one_shape_with_the_eager_steps_logits():
    lm = tiny_lm("qwen2_5_omni")
    clips = _clips(3)
    eager = RowPool(lm, 3, graphs=False)
    inv = RowPool(lm, 3, invariant=Invariant(5, 512))
    for pool in (eager, inv):
        pool.prefill([(f, lang, False) for f, lang in clips])
    assert inv.rows == 5 and inv.cache.capacity == 512 and inv.graphs.fixed
    # a row alone, rows with a gap, and a request wider than MAX_TOKENS (run as steps of MAX_TOKENS)
    steps = [[(1, [5])], [(0, [5, 6, 7]), (2, [8])], [(0, list(range(20, 20 + 2 * MAX_TOKENS + 3))), (2, [17])]]
    for asks in steps:
        for (want_l, want_h), (got_l, got_h) in zip(eager.run(asks), inv.run(asks)):
            torch.testing.assert_close(got_l, want_l, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got_h, want_h, atol=1e-5, rtol=1e-5)
        assert inv.lengths[:3] == eager.lengths and torch.equal(inv.cache.lengths[:3], eager.cache.lengths)
    assert set(inv.graphs.graphs) == {(5, MAX_TOKENS)} and inv.graphs.eager == 0
    assert inv.cache.capacity == 512  # never grown: the span is part of the shape


def test_under_batch_invariant_stepping_a_caption_is_decoded_alone_as_in_a_batch(monkeypatch):
    from speccap.config import LinkConfig
    from speccap.decoding.engine import cloud_only
    from speccap.decoding.link import Link
    lm = tiny_lm("qwen2_5_omni")
    prefilled = []
    real = row_pool.prefill
    counted = lambda m, clips, hidden=False: prefilled.append(len(clips)) or real(m, clips, hidden)  # noqa: E731
    monkeypatch.setattr(row_pool, "prefill", counted)  # a batch's prefill
    monkeypatch.setattr(thinker, "prefill", counted)  # a prompt alone
    fn = lambda e, c, clip: cloud_only(c, clip[0], clip[1], Link(LinkConfig()), 24).token_ids  # noqa: E731
    inv = Invariant(4, 512)
    alone = decode_all(lm, lm, fn, _clips(4), 1, invariant=inv)
    assert prefilled == [1, 1, 1, 1]  # batch 1 still runs through the pool at the one shape
    together = decode_all(lm, lm, fn, _clips(4), 4, invariant=inv)
    assert together == alone and prefilled[4:] == [1, 1, 1, 1]  # each clip prefilled alone in the batch too
    decode_all(lm, lm, fn, _clips(4), 4)
    assert prefilled[8:] == [4]  # without the setting, one prefill for the batch


def test_batch_invariant_stepping_refuses_what_does_not_fit_it():
    lm = tiny_lm("qwen2_5_omni")
    with pytest.raises(ValueError, match="batch of 6 does not fit batch-invariant stepping over 4 rows"):
        RowPool(lm, 6, invariant=Invariant(4, 512))
    with pytest.raises(ValueError, match="at least 1 row and 16 slots"):
        Invariant(4, 8)
    pool = RowPool(lm, 1, invariant=Invariant(1, 32))
    with pytest.raises(ValueError, match="over the 32 slots of batch-invariant stepping"):
        pool.prefill([(f, lang, False) for f, lang in _clips(1)])  # the prompt alone is longer
    pool = RowPool(lm, 1, invariant=Invariant(1, 512))
    pool.prefill([(f, lang, False) for f, lang in _clips(1)])
    with pytest.raises(RuntimeError, match="all 1 rows of batch-invariant stepping are in use"):
        pool.prefill([(f, lang, False) for f, lang in _clips(1)])
    with pytest.raises(ValueError, match="over the 512 slots"):
        pool.run([(0, list(range(5, 5 + 512)))])
    assert Invariant.covering(4, 300, 128).span == 300 + 128 + 2 * MAX_TOKENS


def _alone_and_beside_others(lm) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Row 0's logits at each step under batch-invariant stepping, alone in its pool and beside two
    other clips asking other tokens (a wider request among them)."""
    clips = _clips(3)
    alone, shared = RowPool(lm, 1, invariant=Invariant(4, 512)), RowPool(lm, 3, invariant=Invariant(4, 512))
    alone.prefill([(clips[0][0], clips[0][1], False)])
    shared.prefill([(f, lang, False) for f, lang in clips])
    out = []
    for k, mine in enumerate(([5, 6, 7], [8], list(range(20, 40)), [9, 10])):
        others = [(1, [11 + k] * (1 + k)), (2, list(range(50, 50 + 3 * k + 1)))]
        a = alone.run([(0, mine)])[0][0]
        b = shared.run([(0, mine), *others])[0][0]
        out.append((a.clone(), b.clone()))
    return out


def test_under_batch_invariant_stepping_a_row_gets_the_same_bits_alone_as_beside_others():
    """Without the setting the eager step's logits for the same row differ in the last bits on a CPU
    too: there the shapes follow the rows asking."""
    for a, b in _alone_and_beside_others(tiny_lm("qwen2_5_omni")):
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the rounding that differs by batch is a GPU's")
def test_on_cuda_batch_invariant_stepping_gives_a_row_the_same_bits_alone_as_beside_others():
    lm = tiny_lm("qwen2_5_omni")
    lm.model.to("cuda", torch.bfloat16)
    for a, b in _alone_and_beside_others(lm):  # captured graphs, bfloat16: equal to the bit all the same
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="capturing a graph needs CUDA")
def test_captured_graphs_replay_the_eager_steps_on_cuda():
    lm = tiny_lm("qwen2_5_omni")
    lm.model.to("cuda")
    eager, fixed = _pools(lm, 4, _clips(4))
    assert fixed.graphs.capture
    for k in range(6):  # the first step of a shape captures it, the next ones replay it
        asks = [(r, [5 + k, 6 + k][: 1 + (r + k) % 2]) for r in range(4)]
        for want, got in zip(eager.run(asks), fixed.run(asks)):
            torch.testing.assert_close(got[0], want[0], atol=1e-3, rtol=1e-3)
        assert fixed.lengths == eager.lengths
    assert fixed.graphs.captured >= 1 and fixed.graphs.replayed >= 4

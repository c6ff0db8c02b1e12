"""The verifier server's batching executor (batching.gather): calls from many threads meet in one
forward, each caller gets its own rows, and one caller's bad input fails that caller only."""

import threading

import numpy as np
import pytest
import torch

from speccap.batching.gather import Gather
from speccap.decoding.stats import greedy_stats

from ..models.conftest import tiny_lm


def _clips(seed: int, shapes) -> list[tuple[np.ndarray, str]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((128, n)).astype(np.float32), lang) for n, lang in shapes]


def _as_alone(lm, mel, lang, i, first, logits) -> None:
    """A gathered session's first distribution and extension are what the model gives it alone."""
    alone = lm.start(mel, lang)
    torch.testing.assert_close(first, alone.prefill_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits, alone.extend([5, 6 + i]).logits, atol=1e-4, rtol=1e-4)


def test_calls_from_many_threads_share_forwards_and_get_their_own_rows():
    lm = tiny_lm("qwen2_5_omni")
    g = Gather(max_batch=4, window_s=0.2)
    try:
        stepped = g.wrap(lm)
        clips = _clips(2, ((150, "en"), (90, "zh"), (200, "en"), (120, "en")))
        got = [None] * len(clips)

        def one(i):
            sess = stepped.start(*clips[i])
            got[i] = (sess.prefill_logits, sess.extend([5, 6 + i]).logits)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(clips))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        for i, ((mel, lang), (first, logits)) in enumerate(zip(clips, got)):
            _as_alone(lm, mel, lang, i, first, logits)
        assert g.calls == 2 * len(clips) and g.forwards < g.calls  # starts met, and so did extensions
    finally:
        g.close()


def test_submitted_work_runs_on_the_gather_thread_and_its_calls_meet():
    """`submit`: the work runs in the gather's thread, parked at each model call until the forward
    that serves it and the others; an exception in the work comes back in its future."""
    lm = tiny_lm("qwen2_5_omni")
    g = Gather(max_batch=4, window_s=0.2)
    try:
        stepped = g.wrap(lm)
        clips = _clips(3, ((150, "en"), (90, "zh"), (200, "en")))

        def work(i):
            sess = stepped.start(*clips[i])
            return threading.current_thread().name, sess.prefill_logits, sess.extend([5, 6 + i]).logits

        def broken():
            raise KeyError("no such clip")

        futures = [g.submit(work, i) for i in range(len(clips))]
        failed = g.submit(broken)
        for i, ((mel, lang), fut) in enumerate(zip(clips, futures)):
            where, first, logits = fut.result(timeout=60)
            assert where == "speccap-gather"
            _as_alone(lm, mel, lang, i, first, logits)
        with pytest.raises(KeyError, match="no such clip"):
            failed.result(timeout=60)
        assert g.calls == 2 * len(clips) and g.forwards == 2  # the starts met, then the extensions
    finally:
        g.close()


def test_a_bad_call_fails_its_caller_only():
    lm = tiny_lm("qwen2_5_omni")
    g = Gather(max_batch=2, window_s=0.5)
    try:
        stepped = g.wrap(lm)
        out = {}

        def start(name, features):
            try:
                out[name] = stepped.start(features, "en")
            except ValueError as exc:
                out[name] = exc

        threads = [threading.Thread(target=start, args=("good", np.zeros((128, 100), np.float32))),
                   threading.Thread(target=start, args=("bad", np.zeros(100, np.float32)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert isinstance(out["bad"], ValueError) and "(n_mels, frames)" in str(out["bad"])
        assert out["good"].prompt_len > 0
    finally:
        g.close()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        Gather(0)
    with pytest.raises(ValueError, match=">= 0 seconds"):
        Gather(4, -1.0)


def test_a_run_goes_on_at_each_forward_and_its_caller_gets_it_whole():
    """`extend_run` through the gather, from submitted work and from other threads alike: the run is
    asked again at each forward until it ends, and its caller gets the whole run, the tokens its
    session alone feeds."""
    lm = tiny_lm("qwen2_5_omni")
    clips = _clips(4, ((150, "en"), (90, "zh"), (200, "en")))
    alone = [lm.start(*clip).extend_run([5], greedy_stats, 4 + i, -1) for i, clip in enumerate(clips)]
    g = Gather(max_batch=4, window_s=0.2)
    try:
        stepped = g.wrap(lm)

        def work(i):
            return stepped.start(*clips[i]).extend_run([5], greedy_stats, 4 + i, -1)

        futures = [g.submit(work, i) for i in range(2)]
        got = [None] * len(clips)
        thread = threading.Thread(target=lambda: got.__setitem__(2, work(2)))
        thread.start()
        thread.join(timeout=60)
        got[:2] = [f.result(timeout=60) for f in futures]
        for run, want in zip(got, alone):
            assert run.forwards == want.forwards and run.tokens == want.tokens
            torch.testing.assert_close(run.logits, want.logits, atol=1e-4, rtol=1e-4)
        assert g.forwards >= max(run.forwards for run in alone)
    finally:
        g.close()

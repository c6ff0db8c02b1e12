"""The batching executor (batching.lockstep) against the single one: every loop decodes the same
captions with the same records when its model calls are packed with other captions' into shared
forwards, and the loops' invariants hold batched."""

import numpy as np
import pandas as pd
import pytest
import torch
from greenlet import getcurrent, settrace

from speccap.batching.lockstep import Lockstep, SteppedLM, decode_all
from speccap.batching.step_graphs import Invariant
from speccap.config import LinkConfig
from speccap.decoding.cost import CostModel
from speccap.decoding.engine import SpecSettings, cloud_only, edge_only, speculative
from speccap.decoding.gates import make_gate
from speccap.decoding.link import Link
from speccap.decoding.policies import Fixed, UGSDAdaptive
from speccap.decoding.qs import QSAdaptive
from speccap.decoding.rules import make_rule
from speccap.decoding.stats import TokenStats, greedy_stats
from speccap.decoding.verify import Rank
from speccap.decoding.wisv.head import DecisionHead
from speccap.decoding.wisv.rule import WISV
from speccap.gating.features import TOKEN_SCALARS
from speccap.gating.token_gates import LearnedTokenGate, fit_token_gate

from ..models.conftest import tiny_lm

MAX = 20
# a clock that charges by the cost model: the same seconds in both executors
COST = CostModel({r: {"prefill": [1e-3, 1e-5], "extend": [2e-4, 5e-5, 1e-7]} for r in ("edge", "cloud")})
# what only the measured world sets: wall time, the seconds inside forwards, the process's CPU and memory
UNSHARED = {"wall_time", "model_time", "cpu_percent", "ram_gb"}


@pytest.fixture(scope="module")
def clips():
    rng = np.random.default_rng(5)
    return [(rng.standard_normal((128, frames)).astype(np.float32), lang)
            for frames, lang in ((230, "en"), (120, "zh"), (310, "en"), (90, "en"), (170, "zh"), (260, "zh"))]


def _settings(gate="entropy", threshold=1.5, rule="greedy", policy=None, **kw):
    return SpecSettings(gate=make_gate(gate, threshold, level=kw.pop("level", "block")),
                        rule=kw.pop("rule_obj", None) or make_rule(rule, rank=kw.pop("rank", 2)),
                        policy=policy or Fixed(4), max_new_tokens=MAX, cost=COST, **kw)


def _head(edge, cloud):
    torch.manual_seed(0)
    d = edge.model.config.get_text_config().hidden_size
    return DecisionHead(d, cloud.model.config.get_text_config().hidden_size).eval()


def _sampled(e, c, mel, lang, rule: str, adaptive: bool = False):
    """A sampling edge verified by `rule` (every block sent), Q-S's level fixed or chosen per round."""
    link = Link(LinkConfig())
    verify = make_rule(rule, temperature=1.0, level=8)
    policy = QSAdaptive(verify, link, e.vocab_size, levels=(2, 8, 32), l_max=5) if adaptive else None
    return speculative(e, c, mel, lang, _settings("always", None, rule_obj=verify, policy=policy, temperature=1.0),
                       link)


LOOPS = {
    "edge-only": lambda e, c, mel, lang: edge_only(e, mel, lang, MAX, cost=COST),
    "cloud-only": lambda e, c, mel, lang: cloud_only(c, mel, lang, Link(LinkConfig()), MAX, cost=COST),
    "block gate": lambda e, c, mel, lang: speculative(e, c, mel, lang, _settings(), Link(LinkConfig())),
    "adaptive L, rank 2": lambda e, c, mel, lang: speculative(
        e, c, mel, lang, _settings(rule="rank", policy=UGSDAdaptive()), Link(LinkConfig())),
    "token gate, alone": lambda e, c, mel, lang: speculative(
        e, c, mel, lang, _settings(level="token"), Link(LinkConfig())),
    "token gate, hidden": lambda e, c, mel, lang: speculative(
        e, c, mel, lang, _settings(level="token", trace_hidden=True), Link(LinkConfig())),
    "pipelined": lambda e, c, mel, lang: speculative(e, c, mel, lang, _settings(in_flight=2), Link(LinkConfig())),
    "no cloud cache": lambda e, c, mel, lang: speculative(
        e, c, mel, lang, _settings(cloud_cache=False), Link(LinkConfig())),
    "oracle at a budget": lambda e, c, mel, lang: speculative(
        e, c, mel, lang, _settings("always", None, rule_obj=Rank(1, 2)), Link(LinkConfig())),
    "speculative sampling": lambda e, c, mel, lang: _sampled(e, c, mel, lang, "spec_sampling"),
    "Q-S": lambda e, c, mel, lang: _sampled(e, c, mel, lang, "qs"),
    "Q-S, adaptive level": lambda e, c, mel, lang: _sampled(e, c, mel, lang, "qs", adaptive=True),
    "wisv": lambda e, c, mel, lang: speculative(
        e, c, mel, lang, _settings("always", None, rule_obj=WISV(_head(e, c), 0.5)), Link(LinkConfig())),
}


def _same(single, batched):
    a = {k: v for k, v in single.metrics().items() if k not in UNSHARED}
    b = {k: v for k, v in batched.metrics().items() if k not in UNSHARED}
    assert single.token_ids == batched.token_ids
    assert a == b
    assert [(p["kind"], p["bytes"]) for p in single.packets] == [(p["kind"], p["bytes"]) for p in batched.packets]


# the fixed shapes a GPU replays as graphs, and batch-invariant stepping (batching.step_graphs), run
# eagerly here; 8 rows: a loop without the cloud cache holds two cloud sessions at once
STEPPING = {"eager": {"graphs": False}, "fixed shapes": {"graphs": True},
            "batch-invariant": {"invariant": Invariant(8, 512)}}


@pytest.mark.parametrize("stepping", list(STEPPING))
@pytest.mark.parametrize("loop", list(LOOPS))
def test_every_loop_decodes_the_same_captions_batched(pair, clips, loop, stepping):
    edge, cloud = pair
    fn = LOOPS[loop]
    single = [fn(edge, cloud, mel, lang) for mel, lang in clips]
    # fewer rows than clips: finished loops hand their place to the next clip
    ex = Lockstep(4, **STEPPING[stepping])
    e, c = ex.wrap(edge), ex.wrap(cloud)
    assert isinstance(e, SteppedLM) and isinstance(c, SteppedLM)
    batched = dict(ex.map(lambda job: (job[0], fn(e, c, *job[1])), list(enumerate(clips))))
    for i, rec in enumerate(single):
        _same(rec, batched[i])
    pools = [p for p in ex.pools if p.steps]
    assert pools, "nothing went through a batched forward"
    assert any(p.asked > p.steps for p in pools), "no forward served more than one caption"
    assert all(not p.cache.lengths.any() for p in ex.pools), "a finished caption kept its row"


def test_the_invariants_hold_batched(pair, clips):
    """Threshold +inf is edge-only exactly; -inf with greedy verification is cloud-only exactly."""
    edge, cloud = pair
    alone_e = [edge_only(edge, mel, lang, MAX, cost=COST).token_ids for mel, lang in clips]
    alone_c = [cloud_only(cloud, mel, lang, Link(LinkConfig()), MAX, cost=COST).token_ids for mel, lang in clips]

    def run(threshold):
        return lambda e, c, job: speculative(e, c, job[0], job[1], _settings("entropy", threshold),
                                             Link(LinkConfig())).token_ids

    assert decode_all(edge, cloud, run(float("inf")), clips, 3) == alone_e
    assert decode_all(edge, cloud, run(float("-inf")), clips, 3) == alone_c
    assert alone_e != alone_c  # the two models really differ


def test_rows_come_and_go(pair, clips):
    """A loop holding two sessions of one model at once (no cloud cache: a fresh one per round) gets
    more rows than the batch; a caption longer than a row's room grows the cache."""
    edge, cloud = pair
    ex = Lockstep(2)
    c = ex.wrap(cloud)
    sessions = [c.start(mel, lang) for mel, lang in clips[:3]]  # 3 sessions on a 2-row pool
    assert sorted(s.row for s in sessions) == [0, 1, 2]
    capacity = ex.pools[0].cache.capacity
    long = list(range(5, 5 + 90)) * 3
    out = sessions[0].extend(long)  # runs at once outside a batch
    assert out.logits.shape[0] == len(long) and ex.pools[0].cache.capacity > capacity
    alone = cloud.start(*clips[0])
    want = alone.extend(long).logits
    torch.testing.assert_close(out.logits, want, atol=1e-4, rtol=1e-4)
    sessions[0].rollback(len(long))
    assert sessions[0].length == 0
    row = sessions[1].row
    del sessions[1]  # its row is free again, and the lowest free row is handed out first
    assert c.start(*clips[3]).row == row


def test_a_model_that_cannot_share_a_step_runs_alone():
    """Qwen3-Omni-MoE sessions take HF's forward: the executor leaves the model as it is."""
    moe = tiny_lm("qwen3_omni_moe")
    assert Lockstep(4).wrap(moe) is moe


def test_bad_batches_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        Lockstep(0)


def test_a_job_that_raises_stops_the_batch_with_its_error(pair, clips):
    ex = Lockstep(3)
    e = ex.wrap(pair[0])

    def fn(i):
        e.start(*clips[i]).extend([5])
        if i == 1:
            raise RuntimeError("clip 1 is bad")
        return i

    with pytest.raises(RuntimeError, match="clip 1 is bad"):
        list(ex.map(fn, range(3)))
    assert sorted(ex.map(lambda i: i, range(3))) == [0, 1, 2]  # the executor runs again


def test_a_bad_clip_fails_its_own_caption_only(pair, clips):
    """A prefill that fails for one clip of a step runs again clip by clip: the bad clip's loop gets
    the error (here caught and kept, as the stages' job functions keep it as an error record) and
    the clips that started beside it decode as they do alone."""
    edge, cloud = pair
    jobs = [clips[0], (np.zeros(50, np.float32), "en"), clips[1], clips[2]]

    def caption(e, c, job):
        try:
            return edge_only(e, job[0], job[1], MAX, cost=COST).token_ids
        except ValueError as exc:
            return str(exc)

    got = decode_all(edge, cloud, caption, jobs, 3)
    assert "(n_mels, frames)" in got[1]
    assert [got[i] for i in (0, 2, 3)] == [edge_only(edge, mel, lang, MAX, cost=COST).token_ids
                                           for mel, lang in clips[:3]]


def test_a_step_summarizes_every_row_that_asks_in_one_call(pair, clips):
    """An extension's `summarize` (a drafted token's statistics, the greedy token) runs once per step
    for every row asking with it, and each row gets what its session alone gives it."""
    edge, _ = pair
    calls = []

    def summarize(rows):
        calls.append(len(rows))
        return greedy_stats(rows)

    def job(lm, mel, lang):
        sess = lm.start(mel, lang)
        outs = [sess.extend([t], summarize=summarize) for t in (5, 6, 7)]
        return [(out.summary, out.logits[-1:]) for out in outs]

    alone = [job(edge, mel, lang) for mel, lang in clips[:4]]
    assert calls == [1] * 12
    calls.clear()
    ex = Lockstep(4)
    e = ex.wrap(edge)
    batched = dict(ex.map(lambda ij: (ij[0], job(e, *ij[1])), list(enumerate(clips[:4]))))
    assert calls == [4, 4, 4]  # three steps, all four rows summarized together in each
    # the pool counts the summaries' seconds apart from its forwards' (a profile of the executor reads them)
    assert ex.pools[0].seconds["summary"] > 0 and ex.pools[0].seconds["run"] > 0
    plain = Lockstep(4)
    p = plain.wrap(edge)
    list(plain.map(lambda ij: p.start(*ij).extend([5]), clips[:4]))
    assert plain.pools[0].seconds["summary"] == 0 and plain.pools[0].seconds["run"] > 0
    for i, one in enumerate(alone):
        for (want, _), (got, logits) in zip(one, batched[i]):
            assert isinstance(got, TokenStats)
            # each row's summary is what its own logits give alone, to the bit; and those logits are the
            # single session's within a batched matmul's rounding
            assert got == greedy_stats(logits)[0]
            assert got.token == want.token
            assert got.entropy == pytest.approx(want.entropy, abs=1e-4)


def _tree_gate_model(dim: int, kind: str = "lightgbm"):
    """A token gate's model fitted on random rows of the width a `dim`-wide edge's rows have."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, len(TOKEN_SCALARS) + 1 + dim)).astype(np.float32)
    x[:, len(TOKEN_SCALARS)] = rng.integers(1, 30, 600)
    y = x[:, len(TOKEN_SCALARS) + 1] + x[:, 0] > 0.5
    labels = pd.DataFrame({"critical": y, "mismatch": y, "clip_id": np.arange(600) // 20})
    return fit_token_gate(x, labels, kind, "critical", dim, 0)


def test_a_step_scores_every_loop_that_asks_in_one_call(pair, clips):
    """A gate's scoring waits for the step's other loops and is done in one call for all of them,
    each loop getting its own rows' scores to the bit, and the forwards are the same steps as
    without it: every loop still meets the others at each forward."""
    edge, _ = pair
    model = _tree_gate_model(8)
    calls = []

    class Counted:  # the model, counting the rows of each call
        exact_in_batch = True

        def token_scores(self, x):
            calls.append(len(x))
            return model.token_scores(x)

    def job(lm, scorer, mel, lang):
        sess, out = lm.start(mel, lang), []
        for t in (5, 6, 7):
            logits = sess.extend([t]).logits[-1]
            rows = np.resize(logits[:40].numpy(), (1 + t % 2, 8 + len(TOKEN_SCALARS) + 1))
            out.append(scorer.token_scores(rows))
        return out

    alone = [job(edge, model, mel, lang) for mel, lang in clips[:4]]
    ex = Lockstep(4)
    e = ex.wrap(edge)
    scorer = ex.scorer(Counted())
    batched = dict(ex.map(lambda ij: (ij[0], job(e, scorer, *ij[1])), list(enumerate(clips[:4]))))
    assert calls == [8, 4, 8]  # one call a step, every loop's rows in it (two rows at odd tokens)
    pool = ex.pools[0]
    assert pool.steps == 3 and pool.asked == 12  # three forwards of four rows each, as without scoring
    for i, one in enumerate(alone):
        for want, got in zip(one, batched[i], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5)  # the logits' batched rounding, not the scoring's
    # a model whose scores move in the last bits with the batch's shape scores alone
    linear = _tree_gate_model(8, "logistic")
    assert ex.scorer(linear) is linear and ex.scorer(model) is not model


def test_a_learned_token_gate_decodes_the_same_captions_batched(pair, clips):
    """A tree gate scoring through the executor (one call per step) flags the tokens it flags alone."""
    edge, cloud = pair
    model = _tree_gate_model(edge.model.config.get_text_config().hidden_size)

    def settings(m):
        gate = LearnedTokenGate(m, 0.5)
        return SpecSettings(gate=gate, rule=make_rule("greedy"), policy=Fixed(4), max_new_tokens=MAX, cost=COST)

    single = [speculative(edge, cloud, mel, lang, settings(model), Link(LinkConfig())) for mel, lang in clips]
    flagged = [r.metrics()["escalations"] for r in single]
    assert any(flagged), "the gate flagged nothing: nothing to compare"
    ex = Lockstep(4)
    e, c, m = ex.wrap(edge), ex.wrap(cloud), ex.scorer(model)
    batched = dict(ex.map(lambda ij: (ij[0], speculative(e, c, *ij[1], settings(m), Link(LinkConfig()))),
                          list(enumerate(clips))))
    for i, rec in enumerate(single):
        _same(rec, batched[i])


def test_a_greedy_run_is_continued_by_the_executor_without_its_loop(pair, clips):
    """`extend_run` through the executor: each loop's run goes on at every step without the loop
    being resumed (one switch into it to start, one with the finished run), runs of different
    lengths share the steps, and each run is what the session gives alone: the same tokens fed, the
    hidden states and last logits within a batched matmul's rounding."""
    edge, _ = pair
    free = [edge.start(mel, lang).extend_run([5], greedy_stats, 12, -1) for mel, lang in clips[:4]]
    # a stop token each run meets: a token its free run writes (a run ends on it, unfed)
    stops = [run.summaries[k].token for run, k in zip(free, (5, 8, 2, 10))]
    steps = [12, 3, 7, 12]

    def job(lm, i, mel, lang):
        sess = lm.start(mel, lang)
        run = sess.extend_run([5], greedy_stats, steps[i], stops[i], return_hidden=True)
        return run, sess.length

    alone = [job(edge, i, mel, lang) for i, (mel, lang) in enumerate(clips[:4])]
    for (run, length), stop, n, whole in zip(alone, stops, steps, free):
        meets = 1 + [s.token for s in whole.summaries].index(stop)  # the forward whose summary gives it
        assert run.forwards == length == min(n, meets) and len(run.hidden) == run.forwards
        assert run.summaries == whole.summaries[: run.forwards]
        # a token chosen from every forward but the last of a run that ran all its steps
        assert run.tokens == [s.token for s in run.summaries][: run.forwards - (run.forwards == n)]
    ex = Lockstep(4)
    e = ex.wrap(edge)
    into: list[int] = []
    jobs = {}

    def trace(event, args):
        if event == "switch" and args[1] in jobs:
            into.append(jobs[args[1]])

    def start(ij):
        jobs[getcurrent()] = ij[0]
        return ij[0], job(e, ij[0], *ij[1])

    previous = settrace(trace)
    try:
        batched = dict(ex.map(start, list(enumerate(clips[:4]))))
    finally:
        settrace(previous)
    assert sorted(into) == [0, 0, 1, 1, 2, 2, 3, 3]  # the start's answer, then the whole run
    for (want, want_len), (got, got_len) in zip(alone, [batched[i] for i in range(4)]):
        assert [s.token for s in got.summaries] == [s.token for s in want.summaries] and got_len == want_len
        assert got.tokens == want.tokens
        assert torch.allclose(got.logits, want.logits, atol=1e-4)
        assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(got.hidden, want.hidden))
    assert ex.pools[0].steps == max(r.forwards for r, _ in alone) > min(r.forwards for r, _ in alone)  # side by side


def test_a_start_summarizes_every_first_token_of_its_step_in_one_call(pair, clips):
    """`start(..., summarize=fn)`: the clips that start in a step get their first token's summary
    from one call over them all, each what its session gives alone."""
    edge, _ = pair
    calls = []

    def summarize(rows):
        calls.append(len(rows))
        return greedy_stats(rows)

    alone = [edge.start(mel, lang, summarize=summarize) for mel, lang in clips[:4]]
    assert calls == [1] * 4 and all(s.prefill_summary == greedy_stats(s.prefill_logits[None])[0] for s in alone)
    calls.clear()
    ex = Lockstep(4)
    e = ex.wrap(edge)
    batched = dict(ex.map(lambda ij: (ij[0], e.start(*ij[1], summarize=summarize).prefill_summary),
                          list(enumerate(clips[:4]))))
    assert calls == [4]
    assert [batched[i].token for i in range(4)] == [s.prefill_summary.token for s in alone]
    assert e.start(clips[0][0], clips[0][1]).prefill_summary is None  # nothing asked, nothing made

import math

import numpy as np
import pytest
import torch

from speccap.decoding.gates import make_gate
from speccap.decoding.policies import Fixed, UGSDAdaptive
from speccap.decoding.qs import Lattice, lattice_counts
from speccap.decoding.stats import Block, greedy_stats, sampled_rows, token_stats
from speccap.models.generate import draw, draw_from, pick


def _block(dists: list[list[float]], tokens: list[int]) -> Block:
    b = Block(start=0)
    for d, t in zip(dists, tokens):
        s, _ = token_stats(torch.log(torch.tensor(d)), t)
        b.tokens.append(t)
        b.stats.append(s)
    return b


def test_token_stats():
    s, q = token_stats(torch.log(torch.tensor([0.7, 0.2, 0.1])), 1)
    assert s.top1 == pytest.approx(0.7) and s.margin == pytest.approx(0.5) and s.rank == 2
    assert s.logprob == pytest.approx(math.log(0.2))
    assert s.entropy == pytest.approx(-(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1)))
    assert float(q.sum()) == pytest.approx(1.0)


def test_greedy_stats_are_token_stats_of_each_rows_greedy_token():
    """Batched over rows, to the bit: blocked ids, a tie for the top (the first index wins, as
    `pick` takes it), a sharp and a flat row, runners-up a float32 step below the top, and ids
    blocked with -inf."""
    torch.manual_seed(3)
    rows = torch.randn(6, 500) * 3
    rows[:, :100] = -1e9
    rows[1, 200] = rows[1, 300] = 40.0
    rows[2] = 0.0
    rows[3, 123] = 80.0
    rows[4, 400:410] = 30.0
    rows[4, 405] = float(np.nextafter(np.float32(30.0), np.float32(31.0)))
    rows[5, 100:200] = -math.inf
    got = greedy_stats(rows)
    for row, stats in zip(rows, got):
        want, _ = token_stats(row, int(torch.argmax(row)), 0.0)
        assert stats == want
    assert got[1].token == 200 and got[1].margin == 0.0 and got[2].entropy == pytest.approx(math.log(500))


@pytest.mark.parametrize("entropy_temperature", [None, 0.5])
def test_sampled_rows_are_what_pick_and_token_stats_give_each_row_alone(entropy_temperature):
    """Batched over rows, to the bit: the law a sampling edge draws from (the token `pick` draws
    with the same generator) and every statistic of the token drawn."""
    torch.manual_seed(4)
    rows = torch.randn(6, 700) * 2
    rows[:, :50] = -1e9
    rows[2] = 0.0
    rows[3, 77] = 30.0
    for t in (0.7, 1.0):
        got = sampled_rows(rows, t, entropy_temperature)
        for i, (row, made) in enumerate(zip(rows, got)):
            tok = pick(row, t, np.random.default_rng(i))
            law = made.draw.numpy()
            assert int(np.random.default_rng(i).choice(len(law), p=law / law.sum())) == tok
            want, q = token_stats(row, tok, t, entropy_temperature)
            stats, p = made.stats(tok)
            assert stats == want and torch.equal(p, q)
            assert draw_from(made.cdf, np.random.default_rng(i)) == tok and made.counts is None


def test_sampled_rows_at_a_lattice_carry_each_rows_lattice_point_and_what_it_draws():
    """A Q-S edge's rows: each row's counts are its law's lattice point alone, and its CDF draws
    the token `draw` draws from that point (S-Q: from the law itself)."""
    torch.manual_seed(5)
    rows = torch.randn(5, 300) * 3
    for quantized in (True, False):
        lattice = Lattice(8, quantized)
        for i, made in enumerate(sampled_rows(rows, 0.8, None, lattice)):
            counts = lattice_counts(made.draw, 8)
            assert made.lattice == lattice and (made.counts == counts).all()
            law = counts / 8 if quantized else made.draw
            assert draw_from(made.cdf, np.random.default_rng(i)) == draw(law, np.random.default_rng(i))


def test_gates_read_the_most_uncertain_token():
    sure = [0.98, 0.01, 0.01]
    unsure = [0.4, 0.35, 0.25]
    calm, risky = _block([sure, sure], [0, 0]), _block([sure, unsure], [0, 1])
    entropy = make_gate("entropy", 0.5)
    assert not entropy.escalate(calm) and entropy.escalate(risky)
    margin = make_gate("margin", 0.2)  # escalate when some margin < 0.2
    assert not margin.escalate(calm) and margin.escalate(risky)
    logprob = make_gate("logprob", math.log(0.5))  # escalate when some token is below p = 0.5
    assert not logprob.escalate(calm) and logprob.escalate(risky)
    assert make_gate("always").escalate(calm) and not make_gate("never").escalate(risky)
    with pytest.raises(ValueError, match="needs a threshold"):
        make_gate("entropy")
    with pytest.raises(ValueError, match="unknown gate"):
        make_gate("coin")


def test_ugsd_adaptive_rule():
    p = UGSDAdaptive(3, 5, 7)
    seen = [p.next_length()]
    for corrected in (False, False, False, True, False, True, False, False):
        p.update(5, 5, True, corrected)
        seen.append(p.next_length())
    # Lbase first; Lmax after two clean blocks; Lmin after a correction; else Lbase
    assert seen == [5, 5, 7, 7, 3, 5, 3, 5, 7]
    assert Fixed(4).next_length() == 4
    with pytest.raises(ValueError):
        UGSDAdaptive(5, 3, 7)


def test_greedy_stats_at_a_temperature_change_the_entropy_alone():
    from speccap.decoding.stats import greedy_summary, tempered_entropies
    torch.manual_seed(4)
    rows = torch.randn(3, 200) * 2
    plain, hot = greedy_stats(rows), greedy_summary(2.0)(rows)
    for row, p, h in zip(rows, plain, hot):
        assert (h.token, h.top1, h.margin, h.logprob, h.rank) == (p.token, p.top1, p.margin, p.logprob, p.rank)
        assert h.entropy == pytest.approx(tempered_entropies(row, [2.0])[0], abs=1e-12) and h.entropy > p.entropy
        want, _ = token_stats(row, p.token, 0.0, entropy_temperature=2.0)
        assert want == h
    assert tempered_entropies(rows[0], [1.0])[0] == pytest.approx(plain[0].entropy, abs=1e-12)
    # one function per temperature: a batching executor summarizes the loops that share it together
    assert greedy_summary(None) is greedy_stats and greedy_summary(2.0) is greedy_summary(2.0)


def test_only_the_entropy_gate_takes_a_temperature():
    gate = make_gate("entropy", 0.5, "token", temperature=0.5)
    assert gate.entropy_temperature == 0.5 and gate.describe()["temperature"] == 0.5
    assert make_gate("entropy", 0.5, temperature=1.0).entropy_temperature is None  # 1: the untuned gate
    assert "temperature" not in make_gate("entropy", 0.5).describe()
    with pytest.raises(ValueError, match="entropy gate's: gate 'margin' has none"):
        make_gate("margin", 0.1, temperature=0.5)
    with pytest.raises(ValueError, match="must be > 0"):
        make_gate("entropy", 0.5, temperature=0.0)

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from speccap.decoding.rules import make_rule
from speccap.decoding.verify import Rank, SpecSampling, cloud_rank, cloud_ranks

EOS = 0


def rows_with_order(orders: list[list[int]], vocab: int = 8) -> torch.Tensor:
    """Logit rows whose ranking of token ids is given (first = argmax)."""
    rows = torch.zeros(len(orders), vocab)
    for r, order in enumerate(orders):
        for pos, tok in enumerate(order):
            rows[r, tok] = 10.0 - pos
    return rows


def test_rank_of_a_token():
    row = torch.tensor([0.1, 3.0, 2.0, 2.0])
    assert cloud_rank(row, 1) == 1 and cloud_rank(row, 2) == 2 and cloud_rank(row, 3) == 2 and cloud_rank(row, 0) == 4


def test_a_block_of_ranks_is_each_row_s_own_rank_ties_included():
    rows = torch.tensor([[0.1, 3.0, 2.0, 2.0], [1.0, 1.0, 1.0, 1.0], [4.0, 3.0, 2.0, 1.0], [9.0, 0.0, 0.0, 0.0]])
    tokens = [3, 2, 0]  # fewer tokens than rows: the last row (the bonus token's) is not ranked
    assert cloud_ranks(rows, tokens) == [cloud_rank(rows[i], t) for i, t in enumerate(tokens)] == [2, 1, 1]
    assert cloud_ranks(rows, []) == []


def test_rank_rule_accepts_within_r_and_corrects_the_first_violator():
    rows = rows_with_order([[5, 6, 7], [6, 5, 7], [1, 2, 3, 4, 7], [4]])
    v = Rank(2).verify([6, 5, 7], rows, None, EOS, None)  # ranks 2, 2, 5
    assert (v.accepted, v.token, v.corrected, v.ranks) == (2, 1, True, [2, 2, 5])
    g = Rank(1).verify([6, 5, 7], rows, None, EOS, None)
    assert (g.accepted, g.token, g.corrected) == (0, 5, True)
    assert make_rule("greedy").r == 1 and make_rule("rank", rank=20).r == 20


def test_fully_accepted_block_gets_a_bonus_token_unless_it_ended():
    rows = rows_with_order([[3], [4], [2]])
    v = Rank(1).verify([3, 4], rows, None, EOS, None)
    assert (v.accepted, v.token, v.corrected) == (2, 2, False)
    rows = rows_with_order([[3], [EOS], [2]])
    v = Rank(1).verify([3, EOS], rows, None, EOS, None)
    assert (v.accepted, v.token) == (2, None)


def test_bad_rules():
    with pytest.raises(ValueError, match="R >= 1"):
        Rank(0)
    with pytest.raises(ValueError, match="unknown verification rule"):
        make_rule("vibes")
    with pytest.raises(ValueError, match="temperature > 0"):
        SpecSampling(0)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_spec_sampling_output_follows_the_cloud_distribution(temperature):
    """Draft two tokens from q, verify with p: the first output token ~ p(.|ctx) and, given it,
    the second ~ p(.|ctx, first) (chi-square tests over 30k runs)."""
    vocab = 6
    g = torch.Generator().manual_seed(1)
    cloud = torch.randn(vocab + 1, vocab, generator=g) * 1.5  # row 0: first position; row 1 + t: after token t
    edge = cloud + torch.randn(vocab + 1, vocab, generator=g)  # a different (draft) model
    rule = SpecSampling(temperature)
    rng = np.random.default_rng(0)
    q = torch.softmax(edge.double() / temperature, -1)
    p = torch.softmax(cloud.double() / temperature, -1)
    t = int(torch.argmax(p[0]))  # condition the second token on the likeliest first one
    first, second = np.zeros(vocab), np.zeros(vocab)
    n = 30000
    for _ in range(n):
        d0 = int(rng.choice(vocab, p=q[0].numpy()))
        d1 = int(rng.choice(vocab, p=q[1 + d0].numpy()))
        rows = torch.stack([cloud[0], cloud[1 + d0], cloud[0]])  # last row unused for the check
        v = rule.verify([d0, d1], rows, [q[0], q[1 + d0]], eos=-1, rng=rng)
        out = [d0, d1][: v.accepted] + [v.token]
        first[out[0]] += 1
        if out[0] == t and v.accepted >= 1:  # first token accepted: a second one follows
            second[out[1]] += 1
    assert chisquare(first, n * p[0].numpy()).pvalue > 1e-3
    m = second.sum()
    assert m > 500 and chisquare(second, m * p[1 + t].numpy()).pvalue > 1e-3


def test_naive_acceptance_would_not_follow_the_cloud():
    """Control for the test above: accepting every draft token gives q, which the test rejects."""
    vocab = 6
    g = torch.Generator().manual_seed(1)
    cloud = torch.randn(vocab, generator=g) * 1.5
    edge = cloud + torch.randn(vocab, generator=g)
    p, q = torch.softmax(cloud.double(), -1).numpy(), torch.softmax(edge.double(), -1).numpy()
    rng = np.random.default_rng(0)
    counts = np.bincount(rng.choice(vocab, size=30000, p=q), minlength=vocab)
    assert chisquare(counts, 30000 * p).pvalue < 1e-6


def test_a_token_gate_judges_its_flagged_tokens_by_its_own_rank_per_language():
    from speccap.decoding.gates import make_gate
    from speccap.decoding.verify import rule_for_gate
    gate = make_gate("entropy", 1.0).at_token_level("alone")
    gate.verify_rank = {"en": 1}
    picked = rule_for_gate(Rank(2), gate, "en")
    assert isinstance(picked, Rank) and picked.r == 1
    assert rule_for_gate(Rank(2), gate, "zh").r == 2  # no R of its own for zh: the rule given
    sampling = SpecSampling(1.0)
    assert rule_for_gate(sampling, gate, "en") is sampling  # a sampling rule is the caller's explicit choice
    block = make_gate("entropy", 1.0)
    block.verify_rank = {"en": 1}
    assert rule_for_gate(Rank(2), block, "en").r == 2  # a block gate judges by the rule given


def test_a_correction_allowance_replaces_the_first_k_violators_then_tolerates_without_bonus():
    rows = rows_with_order([[5, 6], [6, 5], [1, 2], [4]])
    capped = Rank(1, max_corrections=1)
    assert capped.for_caption() is not capped and Rank(1).for_caption().max_corrections is None
    caption = capped.for_caption()
    v = caption.verify([6], rows[:2], None, EOS, None)  # rank 2 > 1: the first violator is replaced
    assert (v.accepted, v.token, v.corrected, v.tolerated) == (0, 5, True, 0)
    v = caption.verify([2, 4], rows[2:], None, EOS, None)  # over the allowance: kept, and no bonus token
    assert (v.accepted, v.token, v.corrected, v.tolerated) == (2, None, False, 1)
    fresh = capped.for_caption()  # a new caption starts with the whole allowance
    assert fresh.verify([6], rows[:2], None, EOS, None).corrected
    assert Rank(1, max_corrections=0).verify([6], rows[:2], None, EOS, None).tolerated == 1
    with pytest.raises(ValueError, match="allowance"):
        Rank(1, max_corrections=-1)


def test_a_plan_replaces_the_violators_it_names_by_their_order():
    rows = rows_with_order([[5, 6], [6, 5], [1, 2], [4]])
    planned = Rank(1, plan=frozenset({1})).for_caption()
    v = planned.verify([6], rows[:2], None, EOS, None)  # violator 0: not in the plan, kept, no bonus
    assert (v.accepted, v.token, v.corrected, v.tolerated) == (1, None, False, 1)
    v = planned.verify([2], rows[2:], None, EOS, None)  # violator 1: replaced
    assert (v.accepted, v.token, v.corrected) == (0, 1, True)
    # the allowance of k is the plan of the first k violators, and each caption starts at violator 0
    assert Rank(1, max_corrections=2).plan == frozenset({0, 1})
    assert planned.for_caption().met == 0 and planned.for_caption().plan == frozenset({1})
    assert Rank(1, plan=frozenset({0})).describe() == {"rule": "greedy", "rank": 1, "plan": [0]}
    with pytest.raises(ValueError, match="one of the two"):
        Rank(1, max_corrections=1, plan=frozenset({0}))


def test_a_rank_rule_given_its_ranks_judges_as_it_does_from_the_rows():
    """`verify(..., ranks)`: what a verification's forward brings (models.base.fed_ranks) gives the
    verdict the rows give, corrections, bonus and an allowance's tolerance alike."""
    g = torch.Generator().manual_seed(3)
    for trial in range(200):
        n = 1 + trial % 6
        rows = torch.randint(0, 6, (n + 1, 30), generator=g).float()
        draft = torch.randint(0, 30, (n,), generator=g).tolist()
        for make in (lambda: Rank(1), lambda: Rank(3), lambda: Rank(2, 1)):
            a, b = make(), make()
            want = a.verify(draft, rows, None, eos=29, rng=None)
            got = b.verify(draft, rows, None, eos=29, rng=None, ranks=cloud_ranks(rows, draft))
            assert got == want

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from speccap.decoding import packets
from speccap.decoding.qs import (
    Lattice,
    QuantizeSample,
    SampleQuantize,
    lattice_counts,
    lattice_rows,
    pack_lattice,
    pack_lattices,
    quantize,
    sparse_bits,
    unpack_block,
    unpack_lattice,
)
from speccap.decoding.rules import make_rule


def test_lattice_counts_sum_to_the_level_and_round_to_nearest():
    rng = np.random.default_rng(0)
    for level in (1, 3, 16, 255):
        for _ in range(50):
            q = rng.dirichlet(np.full(11, 0.3))
            b = lattice_counts(q, level)
            assert b.sum() == level and (b >= 0).all()
            assert np.abs(b - level * q).max() < 1  # every count is floor or ceil of l q
            # the units went to the largest remainders
            up = b > np.floor(level * q)
            rem = level * q - np.floor(level * q)
            if up.any() and (~up).any():
                assert rem[up].min() >= rem[~up].max() - 1e-12
    assert lattice_counts(np.array([0.5, 0.5]), 1).tolist() == [1, 0]  # a tie goes to the lower id
    assert lattice_counts(np.array([0.1, 0.3, 0.3, 0.3]), 2).tolist() == [0, 1, 1, 0]


def _counts_by_sort(q: np.ndarray, level: int) -> np.ndarray:
    """Largest-remainder rounding as its definition reads: a stable sort of the remainders."""
    x = level * q / q.sum()
    b = np.floor(x).astype(np.int64)
    b[np.argsort(-(x - b), kind="stable")[: level - b.sum()]] += 1
    return b


@pytest.mark.parametrize("vocab", [7, 5000, 151_646])
def test_lattice_counts_are_the_sorted_definitions_to_the_unit_ties_included(vocab):
    rng = np.random.default_rng(vocab)
    laws = [torch.softmax(torch.from_numpy(rng.normal(size=vocab) * s), -1).numpy() for s in (0.5, 4, 12)]
    laws += [np.full(vocab, 1 / vocab), np.repeat(rng.dirichlet(np.ones(max(vocab // 7, 1))), 7)[:vocab]]
    for q in laws:
        for level in (1, 2, 16, 64):
            assert (lattice_counts(q, level) == _counts_by_sort(q, level)).all()
    with pytest.raises(ValueError, match="level"):
        lattice_counts(np.array([1.0]), 0)
    for bad in ([0.5, -0.1], [0.5, np.nan], [0.5, np.inf], [[0.5, 0.5]], []):
        with pytest.raises(ValueError, match="non-negative"):
            lattice_counts(np.array(bad), 4)


def test_a_steps_lattice_rows_are_each_rows_counts_alone():
    """A Q-S edge's step quantises every row at once: each row gets `lattice_counts` of it alone,
    rows that need no unit, rows of ties and rows needing more units than others included; the law
    its token is drawn from is the lattice point (Q-S) or the row itself (S-Q)."""
    rng = np.random.default_rng(8)
    laws = rng.dirichlet(np.full(40, 0.3), size=6)
    laws[1] = 1 / 40  # every remainder tied
    laws[2] = np.eye(40)[5]  # a point: no unit missing
    laws[3, :20] = 0
    laws[3] /= laws[3].sum()
    for level in (1, 3, 16, 64):
        rows = lattice_rows(laws, level)
        assert all((rows[i] == lattice_counts(law, level)).all() for i, law in enumerate(laws))
        counts, drawn = Lattice(level, True)(laws)
        assert (counts == rows).all() and np.array_equal(drawn, rows / level)
        assert Lattice(level, False)(laws)[1] is laws
    with pytest.raises(ValueError, match="non-negative"):
        lattice_rows(np.array([[0.5, 0.5], [0.5, np.nan]]), 4)


def test_sparse_payload_bit_count_and_roundtrip():
    rng = np.random.default_rng(1)
    vocab = 1000
    for level in (4, 16, 64):
        q = quantize(torch.from_numpy(rng.dirichlet(np.full(vocab, 0.05))), level)
        nnz = int((q > 0).sum())
        assert nnz <= level
        data = pack_lattice(q, level)
        bits = sparse_bits(nnz, vocab, level)
        assert bits == 16 + nnz * (10 + math.ceil(math.log2(level + 1)))
        assert len(data) == 2 + math.ceil((bits - 16) / 8)
        back, rest = unpack_lattice(data + b"tail", vocab, level)
        assert torch.equal(back, q) and rest == b"tail"
        assert len(data) < vocab * 2 / 10  # far below the dense float16 row
    block = [quantize(torch.from_numpy(rng.dirichlet(np.full(vocab, a))), 16) for a in (0.01, 0.1, 5.0)]
    assert pack_lattices(block, 16) == b"".join(pack_lattice(q, 16) for q in block)  # a block: token after token
    assert pack_lattices([], 16) == b""
    with pytest.raises(ValueError, match="level-16 lattice"):
        pack_lattices(block[:1] + [torch.full((vocab,), 1 / vocab, dtype=torch.float64)], 16)
    four = pack_lattice(quantize(torch.tensor([0.5, 0.25, 0.25, 0.0]), 4), 4)
    with pytest.raises(packets.PacketError, match="level-5"):  # counts summing to 4 read at level 5
        unpack_lattice(four, 4, 5)
    with pytest.raises(packets.PacketError, match="need"):
        unpack_lattice(b"\x05\x00\x01", 10, 4)


def _outputs(rule, edge_logits, cloud_logits, temperature, n, seed):
    """n single-token rounds: the edge drafts one token as the rule says, the cloud verifies it;
    returns the committed token of each round."""
    rng = np.random.default_rng(seed)
    p_edge = torch.softmax(edge_logits.double() / temperature, dim=-1)
    q_hat = rule.edge_distribution(p_edge)
    law = (q_hat if rule.sample_quantized else p_edge).numpy()
    rows = torch.stack([cloud_logits, cloud_logits])
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        d = int(rng.choice(len(law), p=law))
        v = rule.verify([d], rows, [q_hat], eos=-1, rng=rng)
        out[i] = d if v.accepted else v.token
    return out


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.6])
def test_qs_output_is_distributed_as_the_cloud_and_sq_is_not(temperature):
    g = torch.Generator().manual_seed(3)
    edge_logits, cloud_logits = 2 * torch.randn(6, generator=g), 2 * torch.randn(6, generator=g)
    p = torch.softmax(cloud_logits.double() / temperature, dim=-1).numpy()
    n = 12000
    for level in (3, 8):
        qs = _outputs(QuantizeSample(level, temperature), edge_logits, cloud_logits, temperature, n, seed=level)
        observed = np.bincount(qs, minlength=6)
        assert chisquare(observed, n * p).pvalue > 1e-3, (level, observed, n * p)
    # the naive order on the coarsest lattice: the cloud divides by probabilities the token was not drawn with
    sq = _outputs(SampleQuantize(3, temperature), edge_logits, cloud_logits, temperature, n, seed=9)
    assert chisquare(np.bincount(sq, minlength=6), n * p).pvalue < 1e-6


def test_make_rule_builds_qs_and_sq():
    assert make_rule("qs", level=32, temperature=0.8).describe() == {"rule": "qs", "temperature": 0.8, "level": 32}
    assert make_rule("sq", level=4).name == "sq" and make_rule("qs").needs_q


def _engine_pair():
    from ..models.conftest import tiny_lm
    return tiny_lm("qwen2_5_omni", seed=1), tiny_lm("qwen2_5_omni", seed=2)


def test_qs_through_the_engine_sends_the_sparse_lattice(tmp_path):
    from speccap.config import LinkConfig
    from speccap.decoding.engine import SpecSettings, speculative
    from speccap.decoding.gates import make_gate
    from speccap.decoding.link import Link
    from speccap.decoding.policies import Fixed
    edge, cloud = _engine_pair()
    mel = np.random.default_rng(0).standard_normal((128, 120)).astype(np.float32)
    sent = []
    recs = {}
    for name in ("qs", "spec_sampling"):
        s = SpecSettings(gate=make_gate("always", None), rule=make_rule(name, temperature=1.0, level=4),
                         policy=Fixed(4), temperature=1.0, max_new_tokens=20, seed=3)
        tap = (lambda d, payload: sent.append(payload)) if name == "qs" else None
        recs[name] = speculative(edge, cloud, mel, "en", s, Link(LinkConfig(), tap=tap))
    verifies = [x for x in sent if packets.parse_header(x)[0] == packets.VERIFY]
    assert len(verifies) == recs["qs"].rounds > 0
    for payload in verifies:
        _, _, _, draft = packets.parse_verify(payload)
        level, qs = unpack_block(packets.verify_tail(payload), len(draft), edge.vocab_size)
        assert level == 4 and len(qs) == len(draft)  # one lattice point of level 4 per draft token, nothing else
        assert all(int((q > 0).sum()) <= 4 for q in qs)
    per_token = {k: sum(p["bytes"] for p in r.packets if p["kind"] == "verify") / r.transmitted
                 for k, r in recs.items()}
    assert per_token["qs"] < per_token["spec_sampling"] / 10  # 96 float16 vs <= 4 sparse entries


def test_adaptive_policy_trades_lattice_resolution_for_channel_rate():
    from speccap.config import LinkConfig
    from speccap.decoding.link import Link
    from speccap.decoding.qs import QSAdaptive
    vocab = 150_000  # Qwen's vocabulary: a dense row would be 300 kB
    plans = {}
    for mbps in (0.35, 4.0, 1000.0):
        rule = QuantizeSample(16)
        link = Link(LinkConfig(uplink_mbps=mbps, downlink_mbps=mbps, rtt_ms=5.0))
        policy = QSAdaptive(rule, link, vocab, levels=(2, 8, 256), l_max=8)
        for level, a in ((2, 0.35), (8, 0.6), (256, 0.8)):  # finer lattices are accepted more often
            policy.accepted[level], policy.checked[level] = 1000 * a, 1000
            rule.nnz[level] = [level * 100, 100]  # and send `level` non-zero entries per token
        policy.t_edge, policy.t_cloud = 2e-3, 5e-3
        length = policy.next_length()
        plans[mbps] = (length, rule.level)
        assert policy.chosen == plans[mbps]
    # 350 kbps: 256 entries cost ~20 ms a token, a coarser lattice pays; 1 Gbps: the finest, longer drafts
    assert plans[0.35][1] == 8 and plans[4.0][1] == plans[1000.0][1] == 256
    assert plans[0.35][0] <= plans[1000.0][0]
    # a verdict at the chosen level moves only that level's acceptance estimate
    policy.update(4, 1, escalated=True, corrected=True)
    assert policy.checked[256] == 1002 and policy.checked[8] == 1000

"""The wisv rule: greedy localization, the head's tolerance, end-of-caption mismatches always
repaired, the channel state reaching the head, and both upload protocols' real packets."""

import numpy as np
import pytest
import torch

from speccap.config import LinkConfig
from speccap.decoding import packets
from speccap.decoding.engine import SpecSettings, speculative
from speccap.decoding.gates import make_gate
from speccap.decoding.link import Link
from speccap.decoding.policies import Fixed
from speccap.decoding.rules import make_rule
from speccap.decoding.verify import Rank
from speccap.decoding.wisv.head import CSI, DecisionHead
from speccap.decoding.wisv.rule import WISV, csi_of

D = 32  # the tiny models' hidden size


class FixedHead(DecisionHead):
    """P(reject) from a function of (edge hidden, cloud hidden, CSI): a head with a known answer."""

    def __init__(self, fn, d_edge=D, d_cloud=D):
        super().__init__(d_edge, d_cloud)
        self.fn = fn

    def forward(self, h_edge, h_cloud, csi):
        return self.fn(h_edge, h_cloud, csi)


def const(p):
    return FixedHead(lambda he, hc, c: torch.full((len(he),), p))


def rows_with_argmax(tops, vocab=10):
    rows = torch.zeros(len(tops), vocab)
    for i, t in enumerate(tops):
        rows[i, t] = 5.0
    return rows


H = [torch.zeros(D)] * 4
CSI_OK = CSI(20, 100, 5)


class ScalarHead(DecisionHead):
    """Reads the cloud's scalars too; keeps what it was given."""

    def __init__(self):
        super().__init__(D, D, d_scalar=4)

    def forward(self, h_edge, h_cloud, csi, scalars=None):
        self.seen = scalars
        return torch.full((len(h_edge),), 0.9)


def test_a_head_that_reads_the_clouds_scalars_gets_them_at_each_asked_mismatch():
    from speccap.decoding.stats import cloud_scalars
    rows = torch.randn(5, 10, generator=torch.Generator().manual_seed(0))
    rows[:, 9] = -10.0  # the cloud never wants to end here (an end mismatch would stop the questions)
    tops = rows.argmax(-1).tolist()
    draft = [tops[0], (tops[1] + 1) % 9, tops[2], (tops[3] + 2) % 9]  # mismatches at 1 and 3
    head = ScalarHead()
    v = WISV(head, 0.5).verify_hidden(draft, rows, H, torch.zeros(5, D), CSI_OK, 9)
    assert v.asked == [1, 3] and v.corrected and v.accepted == 1
    want = np.stack([cloud_scalars(rows[i], draft[i]) for i in (1, 3)])
    np.testing.assert_array_equal(head.seen.numpy(), want)
    assert want[0, 3] == pytest.approx(np.log(v.ranks[1]))


def test_verdicts_on_known_rows():
    eos = 9
    rows = rows_with_argmax([1, 2, 3, 4, 5])  # the cloud's argmax at each position, then the bonus row
    hc = torch.zeros(5, D)
    # mismatches at 1 and 3; a head that tolerates everything accepts the block and adds the bonus
    v = WISV(const(0.1), 0.5).verify_hidden([1, 7, 3, 8], rows, H, hc, CSI_OK, eos)
    assert (v.accepted, v.token, v.corrected, v.tolerated, v.asked) == (4, 5, False, 2, [1, 3])
    # a head that rejects: the first mismatch is replaced by the cloud's argmax (greedy verification)
    v = WISV(const(0.9), 0.5).verify_hidden([1, 7, 3, 8], rows, H, hc, CSI_OK, eos)
    assert (v.accepted, v.token, v.corrected, v.tolerated) == (1, 2, True, 0)
    # the same with tau = 0: greedy verification whatever the head says
    assert WISV(const(0.0), 0.0).verify_hidden([1, 7, 3, 8], rows, H, hc, CSI_OK, eos).accepted == 1
    # a draft that ends the caption where the cloud would not, or the reverse: never tolerated
    v = WISV(const(0.0), 0.5).verify_hidden([1, eos], rows, [H[0], None], hc, CSI_OK, eos)
    assert (v.accepted, v.token, v.corrected, v.asked) == (1, 2, True, [])
    rows_end = rows_with_argmax([1, eos, 3])
    v = WISV(const(0.0), 0.5).verify_hidden([1, 7], rows_end, H[:2], hc, CSI_OK, eos)
    assert (v.accepted, v.token, v.corrected) == (1, eos, True)
    # an accepted end of caption: no bonus token
    v = WISV(const(0.0), 0.5).verify_hidden([1, eos], rows_with_argmax([1, eos, 0]), [H[0], None], hc, CSI_OK, eos)
    assert (v.accepted, v.token) == (2, None)


def test_bad_inputs_are_named():
    rows = rows_with_argmax([1, 2, 3])
    with pytest.raises(ValueError, match="hidden state of every draft token"):
        WISV(const(0.1)).verify_hidden([1, 7], rows, H[:1], torch.zeros(2, D), CSI_OK, 9)
    with pytest.raises(ValueError, match="channel state"):
        WISV(const(0.1)).verify_hidden([1, 7], rows, H[:2], torch.zeros(2, D), None, 9)
    with pytest.raises(ValueError, match="sizes"):
        WISV(const(0.1)).verify_hidden([1, 7], rows, [torch.zeros(8)] * 2, torch.zeros(2, D), CSI_OK, 9)
    with pytest.raises(ValueError, match="tau"):
        WISV(const(0.1), 1.5)
    with pytest.raises(ValueError, match="protocol"):
        WISV(const(0.1), 0.5, "both")
    with pytest.raises(ValueError, match="decision head"):
        make_rule("wisv")


@pytest.fixture(scope="module")
def pair():
    from ...models.conftest import tiny_lm
    return tiny_lm("qwen2_5_omni", seed=1), tiny_lm("qwen2_5_omni", seed=2)


@pytest.fixture(scope="module")
def mel():
    return np.random.default_rng(0).standard_normal((128, 120)).astype(np.float32)


def _run(pair, mel, rule, link_cfg=LinkConfig(), observer=None, sent=None):
    edge, cloud = pair
    s = SpecSettings(gate=make_gate("always", None), rule=rule, policy=Fixed(4), max_new_tokens=24, observer=observer)
    tap = (lambda d, payload: sent.append((d, payload))) if sent is not None else None
    return speculative(edge, cloud, mel, "en", s, Link(link_cfg, tap=tap))


def test_tau_zero_is_greedy_verification(pair, mel):
    greedy = _run(pair, mel, Rank(1))
    wisv = _run(pair, mel, WISV(DecisionHead(D, D), 0.0, "full"))
    assert wisv.token_ids == greedy.token_ids and wisv.accepted == greedy.accepted
    assert wisv.rounds == greedy.rounds and wisv.tolerated == 0 and greedy.corrected > 0


def test_tolerating_head_lengthens_accepted_runs_and_only_end_mismatches_are_repaired(pair, mel):
    eos = pair[0].eos_token_id
    repaired = []

    def observe(block, rows, verdict, committed, cloud_hidden):
        assert cloud_hidden is not None and cloud_hidden.shape == (len(block), D)
        if verdict.corrected:
            repaired.append((block.tokens[verdict.accepted], verdict.token))

    greedy = _run(pair, mel, Rank(1))
    wisv = _run(pair, mel, WISV(const(0.0), 0.5, "full"), observer=observe)
    assert wisv.tolerated > 0 and wisv.accepted / wisv.rounds > greedy.accepted / greedy.rounds
    assert all(eos in pair_ for pair_ in repaired)  # only end-of-caption mismatches were repaired


def test_a_rank_cap_repairs_what_lies_outside_the_clouds_top_r(pair, mel):
    def ranks_seen(store):
        def observe(block, rows, verdict, committed, cloud_hidden):
            store.append((verdict, block.tokens))
        return observe

    free_v: list = []
    _run(pair, mel, WISV(const(0.0), 0.5, "full"), observer=ranks_seen(free_v))  # tolerates all it may
    tolerated_ranks = sorted(r for v, _ in free_v for r in v.ranks[: v.accepted] if r > 1)
    cap = tolerated_ranks[len(tolerated_ranks) // 2]  # about half the mismatches it tolerated lie above
    seen: list = []
    capped = _run(pair, mel, WISV(const(0.0), 0.5, "full", max_rank=cap), observer=ranks_seen(seen))
    # a head that tolerates all, capped at R, is rank-R verification: the same captions and verdicts
    rank_r = _run(pair, mel, Rank(cap))
    assert capped.token_ids == rank_r.token_ids and (capped.rounds, capped.accepted) == (rank_r.rounds, rank_r.accepted)
    assert capped.tolerated > 0
    eos = pair[0].eos_token_id
    repaired_above = 0
    for v, tokens in seen:  # every tolerated token within the cloud's top R; a repaired one outside (or the end)
        assert all(r <= cap for r in v.ranks[: v.accepted])
        if v.corrected:
            assert v.ranks[v.accepted] > cap or eos in (v.token, tokens[v.accepted])
            repaired_above += v.ranks[v.accepted] > cap
    assert repaired_above > 0  # the cap overruled the head
    assert WISV(const(0.0), 0.5, "full", max_rank=3).r == 3 and WISV(const(0.0)).r == 1
    with pytest.raises(ValueError, match="max_rank"):
        WISV(const(0.0), 0.5, "full", max_rank=1)


def test_the_channel_state_reaches_the_head(pair, mel):
    # a head that repairs on a fast uplink (log10 Mbps > 1.5) and tolerates on a slow one
    head = FixedHead(lambda he, hc, c: (c[:, 0] > 1.5).float())
    fast = _run(pair, mel, WISV(head, 0.5, "full"), LinkConfig(uplink_mbps=500, downlink_mbps=1000))
    slow = _run(pair, mel, WISV(head, 0.5, "full"), LinkConfig(uplink_mbps=2, downlink_mbps=10))
    greedy = _run(pair, mel, Rank(1))
    assert fast.tolerated == 0 and fast.token_ids == greedy.token_ids
    assert slow.tolerated > 0 and slow.rounds < greedy.rounds
    markov = LinkConfig(markov=__import__("speccap.config", fromlist=["MarkovParams"]).MarkovParams())
    assert csi_of(Link(markov)).uplink_mbps == 4.0  # the good state, read without advancing the channel


def test_full_hidden_sends_every_state_with_the_ids(pair, mel):
    sent = []
    rec = _run(pair, mel, WISV(const(0.0), 0.5, "full"), sent=sent)
    verifies = [p for d, p in sent if packets.parse_header(p)[0] == packets.VERIFY]
    assert len(verifies) == rec.rounds and rec.hidden_requests == 0
    assert not any(packets.parse_header(p)[0] in (packets.MISMATCH, packets.HIDDEN) for _, p in sent)
    for payload in verifies:
        _, _, _, draft = packets.parse_verify(payload)
        # the channel state first (as the server reads it), then the states
        _, rest = packets.parse_csi(packets.verify_tail(payload))
        _, _, pos, h = packets.parse_hidden(rest)
        n = sum(t != pair[0].eos_token_id for t in draft)
        assert pos == list(range(n)) and h.shape == (n, D)  # every non-end draft token's state, float16


def test_selective_hidden_asks_for_the_mismatches_only(pair, mel):
    sent, asked = [], []
    rec = _run(pair, mel, WISV(const(0.0), 0.5, "selective"), sent=sent,
               observer=lambda b, r, v, c, h: asked.append(list(v.asked)))
    kinds = [packets.parse_header(p)[0] for _, p in sent]
    mism = [packets.parse_mismatch(p)[2] for _, p in sent if packets.parse_header(p)[0] == packets.MISMATCH]
    hidden = [packets.parse_hidden(p) for _, p in sent if packets.parse_header(p)[0] == packets.HIDDEN]
    assert mism == [a for a in asked if a] and rec.hidden_requests == len(mism) > 0
    assert [h[2] for h in hidden] == mism and all(h[3].shape == (len(m), D) for h, m in zip(hidden, mism))
    # the VERIFY carries the ids and the channel state only, and the states follow their request
    for _d, p in sent:
        if packets.parse_header(p)[0] == packets.VERIFY:
            assert packets.parse_csi(packets.verify_tail(p))[1] == b""
    for i, k in enumerate(kinds):
        if k == packets.HIDDEN:
            assert kinds[i - 1] == packets.MISMATCH and sent[i][0] == "up" and sent[i - 1][0] == "down"
    # one extra round trip per request: selective pays it on a long RTT where full does not
    far = LinkConfig(rtt_ms=100.0)
    sel = _run(pair, mel, WISV(const(0.0), 0.5, "selective"), far)
    full = _run(pair, mel, WISV(const(0.0), 0.5, "full"), far)
    assert sel.token_ids == full.token_ids
    assert sel.link_time - full.link_time > 0.9 * sel.hidden_requests * 0.1


def test_pipelined_loop_refuses_wisv(pair, mel):
    edge, cloud = pair
    s = SpecSettings(gate=make_gate("always", None), rule=WISV(const(0.0)), policy=Fixed(4), in_flight=2)
    with pytest.raises(ValueError, match="blocking loop only"):
        speculative(edge, cloud, mel, "en", s, Link(LinkConfig()))


def test_auto_protocol_follows_the_link(pair, mel):
    # long RTT: the extra round trip costs more than the states -> full; no RTT and a very slow
    # uplink: the states cost more than the round trip -> selective
    far = _run(pair, mel, WISV(const(0.0), 0.5, "auto"), LinkConfig(rtt_ms=100.0))
    near = _run(pair, mel, WISV(const(0.0), 0.5, "auto"), LinkConfig(rtt_ms=0.0, uplink_mbps=0.05))
    assert far.hidden_requests == 0 and near.hidden_requests > 0
    assert far.token_ids == near.token_ids

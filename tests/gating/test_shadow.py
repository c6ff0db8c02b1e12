"""On-policy traces against an independent recomputation through the decoding loop itself."""

import numpy as np
import pytest

from speccap.config import LinkConfig
from speccap.decoding.engine import SpecSettings, edge_only, speculative
from speccap.decoding.gates import Gate
from speccap.decoding.link import Link
from speccap.decoding.policies import Fixed
from speccap.decoding.rules import make_rule
from speccap.decoding.verify import cloud_rank
from speccap.gating.features import token_columns, token_rows
from speccap.gating.shadow import ShadowSettings, shadow_caption
from speccap.gating.traces import quality_parts

MAX = 16
REFS = ["A speaker says something in a calm voice.", "Someone talks calmly."]


class _Probe(Gate):
    """A token gate that flags the tokens at `positions` and keeps the rows it was shown."""

    name, needs_hidden = "probe", True

    def __init__(self, positions=(), dim=0, eos=0):
        self.positions, self.dim, self.eos, self.rows = set(positions), dim, eos, []
        self.at_token_level("alone")

    def escalate(self, block):
        raise AssertionError("token level only")

    def flag(self, block):
        self.rows.append(token_rows(block, self.dim, self.eos, first=len(block) - 1)[0])
        return block.start + len(block) - 1 in self.positions


@pytest.fixture(scope="module")
def traced(pair, audio):
    edge, cloud = pair
    x, labels, caption = shadow_caption(edge, cloud, audio[1], "en", REFS, "neutral", ShadowSettings(2, 0.5, MAX))
    return x, labels, caption


def test_trajectory_is_the_edge_only_caption_and_ranks_are_the_clouds(pair, audio, traced):
    edge, cloud = pair
    x, labels, caption = traced
    ref = edge_only(edge, audio[1], "en", MAX)
    assert caption == ref.caption
    assert [row["token"] for row in labels if row["token"] != edge.eos_token_id] == ref.token_ids
    sess = cloud.start(audio[1], "en")  # token by token, not one forward over the caption
    logits = sess.prefill_logits
    for row in labels:
        assert row["cloud_rank"] == cloud_rank(logits, row["token"])
        assert row["mismatch"] == (row["cloud_rank"] > 2)
        if row["token"] != edge.eos_token_id:
            logits = sess.extend([row["token"]]).logits[-1]
    assert any(row["mismatch"] for row in labels)  # the tiny models disagree


def test_features_are_what_a_token_gate_sees_in_the_loop(pair, audio, traced):
    edge, cloud = pair
    x, labels, _ = traced
    dim = x.shape[1] - len(token_columns(0))
    assert dim > 0 and np.abs(x[:, -dim:]).sum() > 0
    probe = _Probe(dim=dim, eos=edge.eos_token_id)
    spec = SpecSettings(gate=probe, rule=make_rule("rank", rank=2), policy=Fixed(4), max_new_tokens=MAX)
    speculative(edge, cloud, audio[1], "en", spec, Link(LinkConfig()))
    np.testing.assert_array_equal(np.stack(probe.rows), x)


def test_impact_is_the_loop_correcting_that_token_and_the_edge_finishing(pair, audio, traced):
    edge, cloud = pair
    _, labels, caption = traced
    mismatches = [row for row in labels if row["mismatch"]]
    for row in mismatches[:3]:
        probe = _Probe(positions=[row["pos"]], eos=edge.eos_token_id)
        spec = SpecSettings(gate=probe, rule=make_rule("rank", rank=2), policy=Fixed(4), max_new_tokens=MAX)
        fixed = speculative(edge, cloud, audio[1], "en", spec, Link(LinkConfig()))
        assert fixed.corrected == 1
        q_fix, q_keep = quality_parts([fixed.caption, caption], REFS, "en", "neutral")
        expect = (3 * (q_fix[0] - q_keep[0]) + 100 * (q_fix[1] - q_keep[1])) / 4
        assert row["impact"] == pytest.approx(expect)
        assert row["critical"] == (expect > 0.5)
    assert all(row["impact"] == 0.0 for row in labels if not row["mismatch"])


def test_dagger_on_the_edges_own_caption_is_the_first_round(pair, audio, traced):
    # committed = the edge-only caption: the same drafts, labels and (to float16 rounding) features
    edge, cloud = pair
    x, labels, caption = traced
    ids = edge_only(edge, audio[1], "en", MAX).token_ids
    x2, labels2, caption2 = shadow_caption(edge, cloud, audio[1], "en", REFS, "neutral", ShadowSettings(2, 0.5, MAX),
                                           committed=ids)
    assert caption2 == caption and labels2 == labels and all(row["kept"] for row in labels2)
    np.testing.assert_allclose(x2, x, atol=2e-2)


def _loop(pair, audio, positions, dim=0):
    edge, cloud = pair
    probe = _Probe(positions=positions, dim=dim, eos=edge.eos_token_id)
    spec = SpecSettings(gate=probe, rule=make_rule("rank", rank=2), policy=Fixed(4), max_new_tokens=MAX)
    return speculative(edge, cloud, audio[1], "en", spec, Link(LinkConfig())), probe


def test_dagger_traces_the_gated_loops_caption_against_the_loop_itself(pair, audio, traced):
    # a gate that corrected the first mismatch leaves the edge's trajectory: the next round traces
    # where the loop really went, and each later mismatch is judged from there
    edge, cloud = pair
    x0, labels0, _ = traced
    dim = x0.shape[1] - len(token_columns(0))
    p0 = next(row["pos"] for row in labels0 if row["mismatch"])
    rec, probe = _loop(pair, audio, [p0], dim)
    assert rec.corrected == 1
    x, labels, caption = shadow_caption(edge, cloud, audio[1], "en", REFS, "neutral", ShadowSettings(2, 0.5, MAX),
                                        committed=rec.token_ids)
    assert caption == rec.caption
    # the features are what the gate saw at each draft of that loop (teacher-forced: to float16 rounding)
    np.testing.assert_allclose(x, np.stack(probe.rows), atol=2e-2)
    assert [row["pos"] for row in labels if not row["kept"]] == [p0] and labels[p0]["mismatch"]
    later = [row for row in labels if row["mismatch"] and row["pos"] > p0]
    assert later  # the tiny models disagree again after the correction
    for row in later[:2]:
        fixed, _ = _loop(pair, audio, [p0, row["pos"]])  # correct it too; the edge finishes
        q_fix, q_keep = quality_parts([fixed.caption, rec.caption], REFS, "en", "neutral")
        assert row["impact"] == pytest.approx((3 * (q_fix[0] - q_keep[0]) + 100 * (q_fix[1] - q_keep[1])) / 4)
    # the corrected position itself: "keep" is the edge's draft there, the edge finishing from it
    keep, _ = _loop(pair, audio, [])
    q_fix, q_keep = quality_parts([rec.caption, keep.caption], REFS, "en", "neutral")
    assert labels[p0]["impact"] == pytest.approx((3 * (q_fix[0] - q_keep[0]) + 100 * (q_fix[1] - q_keep[1])) / 4)


def test_judged_mismatches_keep_what_wisvs_head_reads(pair, audio, traced):
    # both models' states after the draft token and the cloud's scalars about it, as the WISV rule
    # gets them in the loop, recomputed here one session at a time
    import torch

    from speccap.decoding.stats import cloud_scalars
    edge, cloud = pair
    _, labels, _ = traced
    ids = edge_only(edge, audio[1], "en", MAX).token_ids
    eos = edge.eos_token_id
    with_states = [row for row in labels if "h_edge" in row]
    assert with_states and all(row["mismatch"] for row in with_states)
    for row in with_states[:3]:
        j = row["pos"]
        assert ids[j] == row["token"]
        he = edge.start(audio[1], "en").extend(ids[: j + 1], True).hidden[-1]
        hc = cloud.start(audio[1], "en").extend(ids[: j + 1], True).hidden[-1]
        torch.testing.assert_close(torch.tensor(row["h_edge"]), he.half().float(), atol=2e-2, rtol=0)
        torch.testing.assert_close(torch.tensor(row["h_cloud"]), hc.half().float(), atol=2e-2, rtol=0)
        sess = cloud.start(audio[1], "en")
        logits = sess.extend(ids[:j]).logits[-1] if j else sess.prefill_logits
        np.testing.assert_allclose(row["c_scalars"], cloud_scalars(logits, row["token"]), rtol=1e-3, atol=1e-3)
    # the mismatches without them are about the caption's end, which WISV never judges
    for row in labels:
        if row["mismatch"] and "h_edge" not in row:
            assert row["token"] == eos or row["cloud_token"] == eos or row["pos"] >= len(labels) - 1


def test_each_token_keeps_its_entropy_at_every_temperature_of_the_grid(pair, audio, traced):
    """The entropy column at temperature 1 is the gate feature's entropy; the other temperatures
    move it (what tuning the entropy gate reads), the same along the edge's own caption or a
    committed one."""
    from speccap.gating.features import TOKEN_SCALARS
    edge, cloud = pair
    x0, labels0, _ = traced
    assert "entropy_at" not in labels0[0]  # no grid: no column
    grid = ShadowSettings(2, 0.5, MAX, entropy_temperatures=(0.5, 1.0, 2.0))
    x, labels, _ = shadow_caption(edge, cloud, audio[1], "en", REFS, "neutral", grid)
    at = np.array([row["entropy_at"] for row in labels])
    np.testing.assert_allclose(at[:, 1], x[:, TOKEN_SCALARS.index("entropy")], rtol=1e-5)
    assert (at[:, 0] < at[:, 1]).all() and (at[:, 1] < at[:, 2]).all()  # sharper / flatter
    ids = edge_only(edge, audio[1], "en", MAX).token_ids
    _, labels2, _ = shadow_caption(edge, cloud, audio[1], "en", REFS, "neutral", grid, committed=ids)
    np.testing.assert_allclose([row["entropy_at"] for row in labels2], at, rtol=1e-4)

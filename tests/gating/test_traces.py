import dataclasses
import math

import numpy as np
import pytest

from speccap.decoding.engine import SpecSettings, speculative
from speccap.decoding.gates import Always
from speccap.decoding.link import Link
from speccap.decoding.policies import Fixed
from speccap.decoding.stats import cloud_scalars
from speccap.decoding.verify import Rank
from speccap.gating.traces import NO_LINK, TraceSettings, quality, trace_caption, verifying_every_block
from speccap.models.generate import continue_greedy

REFS = ["the speaker sounds calm and steady", "a calm steady voice"]


def test_rows_hold_the_cloud_verdict_and_impact_labels(pair, audio):
    edge, cloud = pair
    s = TraceSettings(verifying_every_block(4, 3, 20), critical_margin=0.5)
    rows, caption = trace_caption(edge, cloud, audio[1], "en", REFS, s)
    plain = speculative(edge, cloud, audio[1], "en", SpecSettings(Always(), Rank(3), Fixed(4), max_new_tokens=20),
                        Link(NO_LINK))
    assert caption == plain.caption  # observing does not change the loop
    assert len(rows) == plain.drafted
    assert all(r["mismatch"] == (r["cloud_rank"] > 3) for r in rows)
    firsts = [r for r in rows if r["first_reject"]]
    assert len(firsts) == plain.corrected > 0 and all(r["mismatch"] for r in firsts)
    for r in rows:
        if r["first_reject"]:
            assert not math.isnan(r["impact"]) and r["critical"] == float(r["impact"] > 0.5)
        elif r["after_reject"]:
            assert math.isnan(r["impact"]) and math.isnan(r["critical"])
        else:  # accepted: nothing to repair
            assert not r["mismatch"] and r["impact"] == 0.0 and r["critical"] == 0.0


def test_impact_is_the_quality_the_draft_token_costs(pair, audio):
    edge, cloud = pair
    s = TraceSettings(verifying_every_block(3, 2, 12), critical_margin=0.0)
    rows, _ = trace_caption(edge, cloud, audio[1], "en", REFS, s)
    # the first block starts the caption: its prefix is its own tokens before the rejection
    first = [r for r in rows if r["block"] == 0]
    j = next(r["i"] for r in first if r["first_reject"])
    prefix = [r["token"] for r in first[:j]]
    keep = continue_greedy(cloud, audio[1], "en", prefix + [first[j]["token"]], 12)
    fix = continue_greedy(cloud, audio[1], "en", prefix + [first[j]["cloud_argmax"]], 12)
    expected = quality(cloud.decode(fix), REFS, "en") - quality(cloud.decode(keep), REFS, "en")
    assert first[j]["impact"] == pytest.approx(expected)
    assert quality(REFS[0], REFS, "en") > quality("zzz", REFS, "en")


def test_hidden_traces_keep_both_states_at_judged_mismatches(pair, audio):
    import torch
    edge, cloud = pair
    plain = TraceSettings(verifying_every_block(4, 1, 20), critical_margin=0.5)
    rows, caption = trace_caption(edge, cloud, audio[1], "en", REFS, plain)
    hidden_rows, hidden_caption = trace_caption(edge, cloud, audio[1], "en", REFS,
                                                dataclasses.replace(plain, hidden=True))
    assert hidden_caption == caption and all("h_edge" not in x for x in rows)  # keeping states changes nothing else
    with_states = [r for r in hidden_rows if "h_edge" in r]
    judged = [r for r in hidden_rows if r["first_reject"] and r["token"] != edge.eos_token_id
              and r["cloud_argmax"] != cloud.eos_token_id]
    assert with_states == judged and len(judged) > 0  # only judged, non end-of-caption mismatches
    # each state is the one that model computes for the draft token after the committed caption
    ids = speculative(edge, cloud, audio[1], "en", SpecSettings(Always(), Rank(1), Fixed(4), max_new_tokens=20),
                      Link(NO_LINK)).token_ids
    for r in with_states[:3]:
        for lm, key in ((edge, "h_edge"), (cloud, "h_cloud")):
            want = lm.start(audio[1], "en").extend(ids[:r["pos"]] + [r["token"]], return_hidden=True).hidden[-1]
            assert torch.allclose(torch.tensor(r[key]), want.half().float(), atol=2e-2), key
        # and the cloud's scalars are those of its distribution at that position
        sess = cloud.start(audio[1], "en")
        logits = sess.extend(ids[:r["pos"]]).logits[-1] if r["pos"] else sess.prefill_logits
        np.testing.assert_allclose(r["c_scalars"], cloud_scalars(logits, r["token"]), rtol=1e-3, atol=1e-3)
        assert r["c_scalars"][3] == pytest.approx(np.log(r["cloud_rank"]))


def test_a_trace_runs_only_a_decoder_that_verifies_every_block(pair, audio):
    edge, cloud = pair
    for other in (dict(gate="entropy", threshold=1.0), dict(rule="greedy"), dict(block_len=0)):
        settings = TraceSettings(verifying_every_block(4, 2, 20).replace(**other))
        with pytest.raises(ValueError, match="a trace verifies every fixed-length block by the rank rule"):
            trace_caption(edge, cloud, audio[1], "en", REFS, settings)

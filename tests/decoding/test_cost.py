"""The cost-model clock (decoding.cost): a fit that recovers its coefficients, a calibration of the
real model classes, and loops whose every clock is the same from run to run under it."""

import dataclasses
import json
from types import SimpleNamespace

import pytest

from speccap.config import LinkConfig
from speccap.decoding.cost import CostModel, Work, calibrate
from speccap.decoding.engine import cloud_only, edge_only, speculative
from speccap.decoding.ledger import Clock
from speccap.decoding.link import Link
from speccap.decoding.policies import UGSDAdaptive

from .test_engine import MAX, _spec

SLOW = LinkConfig(rtt_ms=400.0, uplink_mbps=2.0, downlink_mbps=10.0)


def test_the_fit_recovers_a_known_cost_and_round_trips(tmp_path):
    truth = {"edge": {"prefill": [0.01, 2e-4], "extend": [1e-3, 2e-4, 1e-6]},
             "cloud": {"prefill": [0.02, 5e-4], "extend": [3e-3, 1e-4, 4e-6]}}
    true = CostModel(truth)
    works = [Work(r, f, prefill=True) for r in truth for f in (50, 100, 300)]
    works += [Work(r, n, c) for r in truth for n in (1, 2, 4, 8) for c in (20, 60, 120)]
    fitted = CostModel.fit([(w, true.seconds(w)) for w in works])
    for role in truth:
        for kind in truth[role]:
            assert fitted.coef[role][kind] == pytest.approx(truth[role][kind], rel=1e-6, abs=1e-12)
    (tmp_path / "cost.json").write_text(json.dumps(fitted.to_json()))
    assert CostModel.load(tmp_path / "cost.json").coef == fitted.coef
    with pytest.raises(FileNotFoundError, match="none.json does not exist"):
        CostModel.load(tmp_path / "none.json")
    (tmp_path / "half.json").write_text(json.dumps({"coef": {"edge": truth["edge"]}}))
    with pytest.raises(ValueError, match="no coefficients for cloud"):
        CostModel.load(tmp_path / "half.json")


def test_a_charge_is_the_formula_every_time_and_params_share_one_model():
    coef = {"edge": {"prefill": [0.01, 2e-4], "extend": [1e-3, 2e-4, 1e-6]},
            "cloud": {"prefill": [0.02, 5e-4], "extend": [3e-3, 1e-4, 4e-6]}}
    model = CostModel(coef)
    w = Work("cloud", 3, 40)
    first = model.seconds(w)
    assert first == pytest.approx(3e-3 + 3e-4 + 4e-6 * 3 * 43)
    assert model.seconds(Work("cloud", 3, 40)) == first and model.seconds(Work("cloud", 3, 41)) > first
    params = SimpleNamespace(**{r: SimpleNamespace(**c) for r, c in coef.items()})
    assert CostModel.from_params(params) is CostModel.from_params(params)  # one per set of coefficients
    assert CostModel.from_params(params).coef == coef and CostModel.from_params(None) is None


def test_calibration_times_every_kind_of_call_of_both_models(pair, audio):
    edge, cloud = pair
    model, samples = calibrate({"edge": edge, "cloud": cloud}, [(audio[1], "en")], sizes=(1, 4), steps=2,
                               step_len=4, repeats=1)
    kinds = {(w.role, w.prefill, w.new) for w, _ in samples}
    assert kinds == {(r, True, audio[1].shape[-1]) for r in ("edge", "cloud")} | {
        (r, False, n) for r in ("edge", "cloud") for n in (1, 4)}
    cached = sorted({w.cached for w, _ in samples if w.role == "edge" and not w.prefill})
    assert len(cached) == 2 and cached[1] - cached[0] == 4  # the extends ran at two cache lengths
    assert all(model.seconds(w) >= 0 for w, _ in samples)


def _clocks(rec) -> tuple:
    m = rec.metrics()
    return (rec.token_ids, m["total_time"], m["ttft"], m["wait_time"], m["edge_compute"], m["cloud_compute"])


def test_with_a_cost_model_every_clock_repeats_and_it_is_the_sum_of_the_charges(pair, audio):
    edge, cloud = pair
    cost = CostModel({r: {"prefill": [0.05, 1e-4], "extend": [2e-3, 5e-4, 1e-6]} for r in ("edge", "cloud")})
    runs = {}
    for clock in ("measured", "model"):
        c = cost if clock == "model" else None
        def spec(n, c=c):  # a fresh adaptive policy each time: it keeps state
            return dataclasses.replace(_spec(gate="always", rule="greedy", policy=UGSDAdaptive()), in_flight=n, cost=c)
        runs[clock] = [
            [_clocks(speculative(edge, cloud, audio[1], "en", spec(n), Link(SLOW))) for n in (0, 2)]
            + [_clocks(edge_only(edge, audio[1], "en", MAX, cost=c)),
               _clocks(cloud_only(cloud, audio[1], "en", Link(SLOW), MAX, cost=c))]
            for _ in range(2)]
    first, again = runs["model"]
    assert first == again  # the pipelined loop's waits and TTFT included
    measured_first, measured_again = runs["measured"]
    assert measured_first != measured_again  # measured compute never repeats to the nanosecond
    assert [r[0] for r in first] == [r[0] for r in measured_first]  # the clock never changes a caption
    # edge-only under a model with no cache term: the prefill, then one extend per token it feeds back
    # (every token but a last one that reached the length cap)
    flat = CostModel({"edge": {"prefill": [0.05, 1e-4], "extend": [2e-3, 5e-4, 0.0]}})
    rec = edge_only(edge, audio[1], "en", MAX, cost=flat)
    fed = len(rec.token_ids) - (len(rec.token_ids) == MAX)
    assert rec.total_time == pytest.approx(0.05 + 1e-4 * audio[1].shape[-1] + fed * (2e-3 + 5e-4))


def test_a_charging_clock_refuses_a_call_without_its_work():
    clock = Clock(CostModel({"edge": {"prefill": [0.0, 0.0], "extend": [1.0, 0.0, 0.0]}}))
    assert clock.run(lambda: 1, work=Work("edge", 1, 0)) == (1, 1.0) and clock.virtual == 1.0
    with pytest.raises(ValueError, match="needs each model call's work"):
        clock.run(lambda: 1)

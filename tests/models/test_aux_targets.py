import math

import pytest
import torch

from speccap.models.aux_targets import AUX_TARGETS, CONTOURS, CUE_FLAGS, CUE_SCALES, cue_vector, span_means

RENDERED = {"pitch": 70.0, "pitch_range": 30.0, "rate": 200.0, "volume": 85.0, "tremor": 0.3, "breathiness": 0.0,
            "harshness": 0.0, "pauses": 2, "contour": "falling", "noise_db": -40.0, "text_en": "x"}


def test_span_means_average_each_equal_run_of_audio_positions_in_order():
    states = torch.arange(2 * 7, dtype=torch.float32).view(2, 7, 1)
    audio = torch.tensor([[0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0]], dtype=torch.float32)
    assert span_means(states, audio, 1).flatten().tolist() == [2.5, 8.0]
    # row 0: audio at 1..4 -> spans {1, 2} and {3, 4}; row 1: 7, 8, 9 -> {7, 8} and {9}
    assert span_means(states, audio, 2).tolist() == [[1.5, 3.5], [7.5, 9.0]]
    # more spans than audio positions: the empty ones are zeros, not NaN
    assert span_means(states, audio, 4)[1].tolist() == [7.0, 8.0, 9.0, 0.0]


def test_cue_vector_scales_values_flags_effects_and_indexes_the_contour():
    v = cue_vector(RENDERED)
    assert v[:4] == pytest.approx([(70 - 55) / 15, (30 - 55) / 25, (200 - 170) / 30, (85 - 110) / 25])
    assert v[4:8] == (1.0, 0.0, 0.0, 1.0)  # tremor and pauses rendered, breathiness and harshness not
    assert v[8] == CONTOURS.index("falling")
    assert len(v) == len(CUE_SCALES) + len(CUE_FLAGS) + 1
    # a corpus recording has no rendered cues, or only some: unknown, not zeros
    assert cue_vector(None) is None and cue_vector({}) is None
    assert cue_vector({k: v for k, v in RENDERED.items() if k != "contour"}) is None


def test_cue_loss_skips_unknown_clips_and_is_least_at_the_truth():
    target = AUX_TARGETS["cues"]
    labels = target.collate([cue_vector(RENDERED), None])
    assert target.known(labels).tolist() == [True, False]
    assert math.isnan(labels[1, 0])
    n, f = len(CUE_SCALES), len(CUE_FLAGS)
    exact = torch.zeros(2, target.outputs)
    exact[0, :n] = labels[0, :n]
    exact[0, n: n + f] = (labels[0, n: n + f] * 2 - 1) * 20  # confident and right
    exact[0, n + f + int(labels[0, -1])] = 20
    assert float(target.loss(exact, labels)) < 1e-6  # the unknown row adds nothing (no NaN either)
    wrong = exact.clone()
    wrong[0, 0] += 1.0
    assert float(target.loss(wrong, labels)) == pytest.approx(1.0 / n, rel=1e-4)


def test_class_target_collates_unknown_as_minus_one_and_ignores_it():
    target = AUX_TARGETS["emotion"]
    labels = target.collate([2, None, -1])
    assert labels.tolist() == [2, -1, -1] and target.known(labels).tolist() == [True, False, False]
    out = torch.zeros(3, target.outputs)
    out[0, 2] = 30.0
    out[1:, 0] = 30.0  # confidently "wrong" on the unknown rows: ignored
    assert float(target.loss(out, labels)) < 1e-6

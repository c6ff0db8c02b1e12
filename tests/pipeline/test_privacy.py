"""What the uplink reveals (pipeline.privacy, pipeline.privacy_report), on real TTS speech."""

import dataclasses

import numpy as np
import pytest
import torch

from speccap.config import params_from_dict
from speccap.data.audio_io import read_audio
from speccap.data.manifest import manifest_path, read_manifest
from speccap.data.uplink import Uplink
from speccap.models.learned_uplink import EncoderShape, LearnedUplink, UplinkEncoder
from speccap.models.loading import ModelLoadError
from speccap.params_uplink import LearnedUplinkParams, UplinkParams
from speccap.pipeline.privacy import (
    ATTACKERS,
    SHIFT_S,
    Wire,
    clip_statistics,
    equal_error_rate,
    fit_inverter,
    fit_network_inverter,
    invert,
    levels,
    measure,
    rebuild,
    spread_back,
    stoi,
    verification,
    voice_id,
    wires,
)
from speccap.pipeline.privacy_report import plot, render, target_met

SR, N_FFT = 16000, 400


@pytest.fixture
def speech(tiny_project):
    params, _, _ = tiny_project
    rec = read_manifest(manifest_path(params.data.processed_dir, "test", "en"))[0]
    return read_audio(rec["path"], target_sr=SR).samples


def _rebuilt(speech, wire, prior=None):
    mel = wire.log_mel(speech, SR, N_FFT)
    return stoi(speech, rebuild(wire.view(mel), wire, mel.shape[1], SR, N_FFT, prior), SR)


def test_speech_rebuilt_from_the_log_mel_is_intelligible_and_coarser_wires_reveal_less(speech):
    sent, coarse = Wire(Uplink(), 128, 320, sent=True), Wire(Uplink(128, 8), 128, 320)
    full, less = _rebuilt(speech, sent), _rebuilt(speech, coarse)
    late = stoi(speech, np.concatenate([np.zeros(int(SHIFT_S * SR), np.float32), speech])[: len(speech)], SR)
    assert full > 0.6 and late < 0.3  # the words come back from what the edge sends; the floor does not
    assert late < less < full
    # a normalised view, scaled back by typical levels, still rebuilds to the words' rhythm
    normalised = Wire(Uplink(128, 8, "clip"), 128, 320)
    prior = levels([normalised.unnormalised().view(normalised.log_mel(speech, SR, N_FFT))])
    assert late < _rebuilt(speech, normalised, prior) < full


def test_a_wire_is_float16_at_its_rate_and_the_params_list_what_is_sent_first():
    x = np.random.default_rng(0).standard_normal(SR).astype(np.float32)
    w = Wire(Uplink(32), 128, 320)
    rep = w.encode(x, SR, N_FFT)
    assert rep.dtype == np.float32 and rep.shape == (32, SR // 320)
    assert np.array_equal(rep, rep.astype(np.float16)) and 2 * rep.size == w.bytes_per_second(SR)  # 1 s of audio
    params = params_from_dict({"features": {"hop_length": 320}, "uplink": {"bands": 8, "merge": 4},
                               "privacy": {"candidates": [{"bands": 8, "merge": 4}, {"bands": 16, "normalize": "clip"}]}})
    assert wires(params) == [Wire(Uplink(8, 4), 128, 320, sent=True), Wire(Uplink(16, 1, "clip"), 128, 320)]
    assert wires(params)[0].name == "log-mel 8 bands, hop 1280 (what the edge sends)"
    with pytest.raises(Exception, match="candidates"):
        params_from_dict({"privacy": {"candidates": [{"bands": 0}]}})


def _voice(kind: str, seed: int) -> np.ndarray:
    """Noise shaped low or high: two 'voices' a spectral classifier tells apart."""
    x = np.random.default_rng(seed).standard_normal(SR).astype(np.float32)
    spec = np.fft.rfft(x)
    f = np.fft.rfftfreq(len(x), 1 / SR)
    spec *= (f < 1000) if kind == "low" else (f > 3000)
    return np.fft.irfft(spec, len(x)).astype(np.float32)


def test_voice_identification_against_the_commonest_voice_and_not_without_two_voices():
    train = [(k, _voice(k, i)) for i in range(6) for k in ("low", "high")]
    test = [(k, _voice(k, 100 + i)) for i in range(3) for k in ("low", "high")] + [("low", _voice("low", 200))]
    w = Wire(Uplink(32), 128, 320)
    views = lambda clips: [(k, w.encode(x, SR, N_FFT)) for k, x in clips]  # noqa: E731
    v = voice_id(views(train), views(test), seed=0)
    assert v["measured"] and v["accuracy"]["value"] == 100.0 and v["voices"] == 2
    assert v["majority"] == pytest.approx(100 * 4 / 7) and set(v["accuracy_by_attacker"]) == {"clip statistics", "frames"}
    # two voices told apart every time: every same-voice pair scores above every other-voice pair
    assert v["eer"]["value"] == 0.0 and v["eer_attacker"] in v["eer_by_attacker"]
    # normalising each band over the clip hides the level and spread, not the statistics beyond them
    n = Wire(Uplink(32, 1, "clip"), 128, 320)
    normed = voice_id([(k, n.encode(x, SR, N_FFT)) for k, x in train], [(k, n.encode(x, SR, N_FFT)) for k, x in test], 0)
    assert normed["accuracy_by_attacker"]["clip statistics"] > normed["majority"]
    stats = clip_statistics(n.encode(train[0][1], SR, N_FFT))
    assert stats.shape == (5 * 32,) and np.abs(stats[:32]).max() < 1e-2  # levels: gone
    one = voice_id([t for t in views(train) if t[0] == "low"], views(test), seed=0)
    assert not one["measured"] and "speaker" in one["why"]


def _wire(name, stoi_ci, acc_ci, majority=10.0, sent=False, learned=None):
    ci = dict(zip(("value", "ci_low", "ci_high"), stoi_ci))
    acc = dict(zip(("value", "ci_low", "ci_high"), acc_ci))
    by = {ATTACKERS[0]: ci} | ({ATTACKERS[1]: dict(zip(("value", "ci_low", "ci_high"), learned))} if learned else {})
    return {"name": name, "sent": sent, "bytes_per_second": 100.0, "stoi": ci, "stoi_by_attacker": by,
            "voice_id": {"measured": True, "accuracy": acc, "majority": majority, "voices": 10,
                         "eer": {"value": 40.0, "ci_low": 35.0, "ci_high": 45.0}}}


def test_the_report_says_which_representation_meets_the_target_and_what_binds():
    floor = {"value": 0.05, "ci_low": 0.04, "ci_high": 0.06}
    today = _wire("log-mel today", (0.8, 0.78, 0.82), (90, 88, 92), sent=True)
    quiet = _wire("quiet", (0.2, 0.18, 0.25), (11, 8, 14))
    loud_voice = _wire("loud voice", (0.2, 0.18, 0.25), (40, 35, 45))
    assert target_met(quiet) and not target_met(loud_voice) and not target_met(today)
    met = render({"clips": 2, "languages": ["en"], "floor": floor, "wires": [today, quiet]})
    assert "met by quiet" in met and ("| quiet | 100 | 0.200 [0.180, 0.250] | 0.200 [0.180, 0.250] | not measured | "
                                      "11.0 [8.0, 14.0] (10 voices) | 10.0 | 40.0 [35.0, 45.0] |") in met
    none = render({"clips": 2, "languages": ["en"], "floor": floor, "wires": [today, loud_voice]})
    assert "met by none" in none and "loud voice rebuilds to STOI 0.200" in none and "the voice binds" in none
    loud_words = _wire("loud words", (0.5, 0.45, 0.55), (9, 7, 12))
    words = render({"clips": 2, "languages": ["en"], "floor": floor, "wires": [today, loud_words]})
    assert "the words bind first" in words and "(loud words)" in words
    assert "not in the pipeline (see below)" in none  # a candidate's quality is not claimed
    assert "at least as much as spreading back" in met
    weaker = _wire("merged", (0.4, 0.38, 0.42), (20, 18, 22), learned=(0.35, 0.33, 0.37))
    said = render({"clips": 2, "languages": ["en"], "floor": floor, "wires": [today, weaker]})
    assert "rebuilds less than spreading back from 1 of 2 representations (merged)" in said


def test_without_train_clips_the_voice_is_not_measured_and_without_test_clips_it_stops(tiny_project, tmp_path):
    import dataclasses
    import shutil

    from speccap.pipeline.privacy import measure
    params, _, _ = tiny_project
    proc = tmp_path / "proc"
    shutil.copytree(params.data.processed_dir, proc)
    for lang in params.data.languages:  # MER2024 without a trace pool: referenced test clips only
        manifest_path(proc, "train", lang).unlink()
    p = dataclasses.replace(params, data=dataclasses.replace(params.data, processed_dir=str(proc)),
                            privacy=dataclasses.replace(params.privacy, clips=1, candidates=()))
    r = measure(p, workers=0)
    assert r["clips"] == len(params.data.languages) and not r["wires"][0]["voice_id"]["measured"]
    assert r["wires"][0]["stoi"]["value"] > 0.5
    # no train clips to learn an inverter from: only spreading back rebuilds
    assert list(r["wires"][0]["stoi_by_attacker"]) == [ATTACKERS[0]] and r["inverter_train_clips"] == 0
    manifest_path(proc, "test", "zh").unlink()
    with pytest.raises(FileNotFoundError, match=r"no test manifest for zh at .*dvc repro prepare"):
        measure(p, workers=0)


def test_what_a_correct_caption_says_of_the_speaker_names_the_voice_this_often():
    from speccap.pipeline.privacy import named_by_the_caption
    recs = [{"speaker": s, "gender": g, "speech_language": "en"} for s, g in
            [("a", "male")] * 3 + [("b", "male")] + [("c", "female")] * 2 + [("d", "female")] * 2]
    got = named_by_the_caption(recs + [{"speaker": "e"}])  # a clip without gender does not count
    assert got == {"measured": True, "accuracy": 100.0 * (3 + 2) / 8, "groups": 2}
    assert not named_by_the_caption([{"speaker": "a"}])["measured"]
    floor = {"value": 0.05, "ci_low": 0.04, "ci_high": 0.06}
    md = render({"clips": 2, "languages": ["en"], "floor": floor, "named_by_the_caption": got,
                 "wires": [_wire("today", (0.8, 0.78, 0.82), (90, 88, 92), sent=True)]})
    assert "names the voice in 62.5% of test clips" in md


def test_the_learned_inverter_rebuilds_pooled_bands_closer_than_spreading_back(tiny_project):
    params, _, _ = tiny_project
    recs = [r for lang in params.data.languages for split in ("train", "test")
            for r in read_manifest(manifest_path(params.data.processed_dir, split, lang))]
    sent, pooled = Wire(Uplink(), 128, 320), Wire(Uplink(8), 128, 320)
    mels = [sent.log_mel(read_audio(r["path"], target_sr=SR).samples, SR, N_FFT) for r in recs]
    held_out, train = mels[0], mels[1:]
    inverter = fit_inverter([(spread_back(pooled.view(m), pooled, m.shape[1]), m) for m in train])
    spread = spread_back(pooled.view(held_out), pooled, held_out.shape[1])
    learned = invert(inverter, spread)
    assert learned.shape == held_out.shape
    # within a pooled group spreading back is flat; the inverter learned the spectrum's shape inside it
    assert ((learned - held_out) ** 2).mean() < 0.8 * ((spread - held_out) ** 2).mean()
    # and the full log-mel it passes through nearly unchanged
    full = fit_inverter([(m, m) for m in train])
    assert np.abs(invert(full, held_out) - held_out).mean() < 0.05


def test_the_equal_error_rate_of_pairs_and_of_posteriors():
    same = np.array([True, True, False, False])
    assert equal_error_rate(np.array([0.9, 0.8, 0.2, 0.1]), same) == 0.0  # every same pair above every other
    assert equal_error_rate(np.array([0.1, 0.2, 0.8, 0.9]), same) == 100.0
    assert equal_error_rate(np.array([0.9, 0.2, 0.8, 0.1]), same) == 50.0
    assert np.isnan(equal_error_rate(np.array([0.5, 0.4]), np.array([True, True])))  # no other-voice pair
    rng = np.random.default_rng(0)
    speakers = np.repeat(np.arange(6), 8)
    sharp = np.log(np.eye(6)[speakers] * 0.9 + 0.1 / 6)
    noise = np.log(rng.dirichlet(np.ones(6), size=len(speakers)))
    told = verification({"sharp": sharp, "noise": noise}, speakers, seed=0)
    assert told["eer_attacker"] == "sharp" and told["eer"]["value"] == 0.0 and told["eer"]["n"] == len(speakers)
    assert 30 < told["eer_by_attacker"]["noise"] < 70  # posteriors that know nothing: near chance


def test_a_learned_uplink_the_edge_sends_is_measured_by_the_learned_attackers(tiny_project, tmp_path):
    """uplink.learned: the stage reads the encoder trained with the cloud; the learned inverter rebuilds
    speech from its rows (no bands to spread back), and the voice classifiers retrain on them."""
    params, _, _ = tiny_project
    torch.manual_seed(0)
    learned = LearnedUplink.trained(UplinkEncoder(EncoderShape(128, 8, 16, 4, "clip")))
    learned.save(tmp_path / "models" / "cloud")
    p = dataclasses.replace(params, uplink=UplinkParams(None, 4, "clip", LearnedUplinkParams(8, 16)),
                            models=dataclasses.replace(params.models, dir=str(tmp_path / "models")),
                            privacy=dataclasses.replace(params.privacy, clips=1, candidates=(UplinkParams(8),)))
    sent = wires(p)[0]
    assert sent.sent and sent.uplink == learned and sent.name.startswith("learned 8 rows")
    r = measure(p, workers=0)
    w = r["wires"][0]
    assert w["learned"]["rows"] == 8 and w["digest"] == learned.digest and (w["merge"], w["normalize"]) == (4, "clip")
    assert list(w["stoi_by_attacker"]) == [ATTACKERS[1]] and 0 < w["stoi"]["value"] < 1
    assert w["bytes_per_second"] == 2 * 8 * SR / (320 * 4) and w["voice_id"]["measured"]
    assert list(r["wires"][1]["stoi_by_attacker"]) == list(ATTACKERS)  # the pooled candidate, both attackers
    md = render(r)
    assert "no bands to spread" in md and f"learned 8 rows, hop 1280, clip-normalised ({learned.digest})" in md
    plot(r, tmp_path / "privacy.png")
    (tmp_path / "models" / "cloud" / "uplink_encoder.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="uplink_encoder.safetensors: missing"):
        wires(p)


def test_the_network_inverter_undoes_a_nonlinear_encoding_the_ridge_map_cannot():
    """Against a learned (nonlinear) encoder the learned attacker is a network: on held-out frames of an
    encoding a linear map cannot undo (the square root of each value, its sign kept), it rebuilds far closer than the ridge map."""
    rng = np.random.default_rng(0)
    mels = [rng.uniform(-1, 1, (6, 100)).astype(np.float32) for _ in range(41)]
    pairs = [(np.sign(m) * np.sqrt(np.abs(m)), m) for m in mels]
    held_out, train = pairs[0], pairs[1:]
    ridge, net = fit_inverter(train), fit_network_inverter(train, seed=0, steps=1500)
    errors = {name: float(((invert(inv, held_out[0]) - held_out[1]) ** 2).mean()) for name, inv in
              (("ridge", ridge), ("network", net))}
    assert errors["network"] < 0.3 * errors["ridge"], errors
    # from its seed, the same network
    again = [invert(fit_network_inverter(train, seed=0, steps=20), held_out[0]) for _ in range(2)]
    assert np.array_equal(*again)

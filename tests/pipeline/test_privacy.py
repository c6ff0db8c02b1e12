"""What the uplink reveals (pipeline.privacy, pipeline.privacy_report), on real TTS speech."""

import numpy as np
import pytest

from speccap.config import params_from_dict
from speccap.data.audio_io import read_audio
from speccap.data.manifest import manifest_path, read_manifest
from speccap.pipeline.privacy import SHIFT_S, Wire, rebuild, stoi, voice_id, wires
from speccap.pipeline.privacy_report import render, target_met

SR, N_FFT = 16000, 400


@pytest.fixture
def speech(tiny_project):
    params, _, _ = tiny_project
    rec = read_manifest(manifest_path(params.data.processed_dir, "test", "en"))[0]
    return read_audio(rec["path"], target_sr=SR).samples


def test_speech_rebuilt_from_the_log_mel_is_intelligible_and_coarser_wires_reveal_less(speech):
    sent, coarse = Wire(128, 320, sent=True), Wire(128, 2560)
    full = stoi(speech, rebuild(sent.encode(speech, SR, N_FFT), sent, SR, N_FFT), SR)
    late = stoi(speech, np.concatenate([np.zeros(int(SHIFT_S * SR), np.float32), speech])[: len(speech)], SR)
    less = stoi(speech, rebuild(coarse.encode(speech, SR, N_FFT), coarse, SR, N_FFT), SR)
    assert full > 0.6 and late < 0.3  # the words come back from what the edge sends; the floor does not
    assert late < less < full


def test_a_wire_is_float16_at_its_rate_and_the_params_list_today_first():
    x = np.random.default_rng(0).standard_normal(SR).astype(np.float32)
    rep = Wire(32, 320).encode(x, SR, N_FFT)
    assert rep.dtype == np.float16 and rep.shape == (32, SR // 320)
    assert rep.nbytes == Wire(32, 320).bytes_per_second(SR)  # one second of audio
    params = params_from_dict({"features": {"hop_length": 320}, "privacy": {"candidates": [[8, 4]]}})
    assert wires(params) == [Wire(128, 320, sent=True), Wire(8, 1280)]
    with pytest.raises(Exception, match="candidates"):
        params_from_dict({"privacy": {"candidates": [[0, 1]]}})


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
    v = voice_id(Wire(32, 320), train, test, SR, N_FFT, seed=0)
    assert v["measured"] and v["accuracy"]["value"] == 100.0 and v["voices"] == 2
    assert v["majority"] == pytest.approx(100 * 4 / 7)
    one = voice_id(Wire(32, 320), [t for t in train if t[0] == "low"], test, SR, N_FFT, seed=0)
    assert not one["measured"] and "speaker" in one["why"]


def _wire(name, stoi_ci, acc_ci, majority=10.0, sent=False):
    ci = dict(zip(("value", "ci_low", "ci_high"), stoi_ci))
    acc = dict(zip(("value", "ci_low", "ci_high"), acc_ci))
    return {"name": name, "sent": sent, "bytes_per_second": 100.0, "stoi": ci,
            "voice_id": {"measured": True, "accuracy": acc, "majority": majority, "voices": 10}}


def test_the_report_says_which_representation_meets_the_target_and_what_binds():
    floor = {"value": 0.05, "ci_low": 0.04, "ci_high": 0.06}
    today = _wire("log-mel today", (0.8, 0.78, 0.82), (90, 88, 92), sent=True)
    quiet = _wire("quiet", (0.2, 0.18, 0.25), (11, 8, 14))
    loud_voice = _wire("loud voice", (0.2, 0.18, 0.25), (40, 35, 45))
    assert target_met(quiet) and not target_met(loud_voice) and not target_met(today)
    met = render({"clips": 2, "languages": ["en"], "floor": floor, "wires": [today, quiet]})
    assert "met by quiet" in met and "| quiet | 100 | 0.200 [0.180, 0.250] | 11.0 [8.0, 14.0] (10 voices) |" in met
    none = render({"clips": 2, "languages": ["en"], "floor": floor, "wires": [today, loud_voice]})
    assert "met by none" in none and "(loud voice)" in none and "What binds is the voice" in none
    assert "not in the pipeline (see below)" in none  # a candidate's quality is not claimed


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
    manifest_path(proc, "test", "zh").unlink()
    with pytest.raises(FileNotFoundError, match=r"no test manifest for zh at .*dvc repro prepare"):
        measure(p, workers=0)

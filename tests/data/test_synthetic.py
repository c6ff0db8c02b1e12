import numpy as np
import soundfile as sf

from speccap.data.audio_io import read_audio
from speccap.data.emotions import EMOTIONS, detect_emotion
from speccap.data.features import prosody
from speccap.data.synthetic import VOICES, make_clip, plan_corpus


def test_plan_is_deterministic_and_sized():
    plans = plan_corpus(0, {"train": 5, "val": 2, "test": 3})
    assert len(plans) == 2 * 10
    assert len({p.clip_id for p in plans}) == len(plans)
    assert plans == plan_corpus(0, {"train": 5, "val": 2, "test": 3})


def test_same_seed_same_clip_other_seed_other_clip(tmp_path):
    plan = plan_corpus(3, {"train": 1, "val": 0, "test": 0}, ["en"])[0]
    a = make_clip(plan, tmp_path / "a", 3)
    b = make_clip(plan, tmp_path / "b", 3)
    assert a["cues"] == b["cues"] and a["references"] == b["references"]
    assert (tmp_path / "a" / f"{plan.clip_id}.wav").read_bytes() == (tmp_path / "b" / f"{plan.clip_id}.wav").read_bytes()
    other = plan_corpus(4, {"train": 1, "val": 0, "test": 0}, ["en"])[0]
    assert make_clip(other, tmp_path / "c", 3)["cues"] != a["cues"]


def test_existing_wav_is_not_rendered_again(tmp_path):
    plan = plan_corpus(0, {"train": 1, "val": 0, "test": 0}, ["zh"])[0]
    rec = make_clip(plan, tmp_path, 2)
    path = tmp_path / f"{plan.clip_id}.wav"
    mtime = path.stat().st_mtime_ns
    again = make_clip(plan, tmp_path, 2)
    assert path.stat().st_mtime_ns == mtime and again == rec


def test_corpus_is_varied_and_audio_follows_the_cues(tmp_path):
    plans = plan_corpus(0, {"train": 70, "val": 0, "test": 0})
    recs = [make_clip(p, tmp_path, 2) for p in plans]
    assert {r["emotion"] for r in recs} == set(EMOTIONS)
    assert {r["gender"] for r in recs} == {"male", "female"}
    assert len({r["speaker"] for r in recs}) >= 10
    assert len({r["cues"]["text_en"] for r in recs}) >= 30
    for r in recs:
        assert sf.info(r["path"]).samplerate == 16000 and sf.info(r["path"]).channels == 1
        assert detect_emotion(r["references"]["en"][0], "en") == r["emotion"]
        assert detect_emotion(r["references"]["zh"][0], "zh") == r["emotion"]
    # measured acoustics track the rendered cue values (same-gender comparison)
    meas = [(r, prosody(read_audio(r["path"]).samples)) for r in recs]
    fem = [(r["cues"]["pitch"], m["f0_mean"]) for r, m in meas if r["gender"] == "female"]
    cue, f0 = np.array(fem).T
    assert np.corrcoef(cue, f0)[0, 1] > 0.5
    # more words per minute -> shorter clip for the same words; compare within one sentence length
    sec_per_char = np.array([r["duration"] / len(r["cues"]["text_en"]) for r, _ in meas if r["speech_language"] == "en"
                             and r["cues"]["pauses"] == 0])
    rates = np.array([r["cues"]["rate"] for r, _ in meas if r["speech_language"] == "en" and r["cues"]["pauses"] == 0])
    assert np.corrcoef(rates, sec_per_char)[0, 1] < -0.4


def test_voices_cover_both_genders_in_both_languages():
    for lang in ("en", "zh"):
        assert {g for _, g, _ in VOICES[lang]} == {"male", "female"}


def test_corpus_audio_does_not_depend_on_order_or_process(tmp_path):
    # two clean runs of `prepare` render the same clips in different orders and workers; before
    # eSpeak's noise seed was fixed, about a third of the clips came out different
    import subprocess
    import sys
    plans = plan_corpus(5, {"train": 8, "val": 0, "test": 0})
    for plan in plans:
        make_clip(plan, tmp_path / "a", 1)
    code = ("import sys; from pathlib import Path; from speccap.data.synthetic import make_clip, plan_corpus\n"
            "for p in reversed(plan_corpus(5, {'train': 8, 'val': 0, 'test': 0})):\n"
            "    make_clip(p, Path(sys.argv[1]), 1)\n")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "b")], check=True, timeout=120)
    differ = [p.clip_id for p in plans if (tmp_path / "a" / f"{p.clip_id}.wav").read_bytes()
              != (tmp_path / "b" / f"{p.clip_id}.wav").read_bytes()]
    assert differ == []


def test_a_clip_renderer_that_fails_or_dies_is_a_clear_error(tmp_path, monkeypatch):
    # the whole clip renders in one forked child: its error comes back with the clip's name, and a
    # child killed mid-clip is an error too, never a silent or half-written WAV
    import os

    import pytest

    from speccap.data import synthetic
    from speccap.data.tts import TTSError
    plan = plan_corpus(5, {"train": 1, "val": 0, "test": 0})[0]
    monkeypatch.setattr(synthetic, "render", lambda *a: (_ for _ in ()).throw(ValueError("bad cue")))
    with pytest.raises(TTSError, match=f"rendering clip {plan.clip_id}: ValueError\\('bad cue'\\)"):
        make_clip(plan, tmp_path, 1)
    monkeypatch.setattr(synthetic, "render", lambda *a: os.kill(os.getpid(), 9))
    with pytest.raises(TTSError, match=f"rendering clip {plan.clip_id} died"):
        make_clip(plan, tmp_path, 1)
    assert list(tmp_path.iterdir()) == []
